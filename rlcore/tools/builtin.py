"""Built-in tools: `add` (the tiny task's tool) and `calculator` (verl's GSM8K tool recipe: safe arithmetic).
Each module-level TOOL_SCHEMA is the schema their tool_configs/*.yaml entries carry."""

from __future__ import annotations

import ast
import operator
from typing import Any

from rlcore.tools.base import BaseTool


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """An OpenAI function schema."""
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties, "required": required}}}


class AddTool(BaseTool):
    """Adds two integers: execute({"a": 2, "b": 3}) -> "5"."""

    TOOL_SCHEMA = _function("add", "Add two integers and return their sum.",
                            {"a": {"type": "integer", "description": "first addend"},
                             "b": {"type": "integer", "description": "second addend"}}, ["a", "b"])

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> tuple[str, float | None, dict]:
        a, b = parameters.get("a"), parameters.get("b")
        bad = [f"{key}={value!r} ({type(value).__name__})" for key, value in (("a", a), ("b", b))
               if not isinstance(value, int) or isinstance(value, bool)]
        if bad:
            raise ValueError(f"add takes integers a and b, got {', '.join(bad)}")
        return str(a + b), None, {}


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPRESSION_CHARS = 500  # longer input is not arithmetic a model needs help with
MAX_EXPONENT = 100  # |b| in a ** b: keeps one power from taking the process's memory and time
MAX_INT_BITS = 4096  # bigger integer results are refused, so nested powers cannot blow up either


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary -, parentheses. Names, calls and
    everything else raise ValueError, as do exponents past MAX_EXPONENT and integers past MAX_INT_BITS bits."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool is an int subclass: refused
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ValueError(f"result has more than {MAX_INT_BITS} bits")
        if isinstance(value, complex):  # a negative number to a fractional power
            raise ValueError("result is not a real number")
        return value
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}")


def format_number(value: int | float) -> str:
    """Short text for a result: integers (also 6 / 3 = 2.0) without ".0", other floats to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


class CalculatorTool(BaseTool):
    """Evaluates arithmetic safely (no eval: an ast walk over numbers and operators): "(3 + 4) * 2" -> "14"."""

    TOOL_SCHEMA = _function("calculator", "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
                            {"expression": {"type": "string", "description": "e.g. (48 / 2) + 48"}}, ["expression"])

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> tuple[str, float | None, dict]:
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            raise ValueError(f"calculator takes a string expression, got {expression!r}")
        return format_number(evaluate(expression)), None, {}
