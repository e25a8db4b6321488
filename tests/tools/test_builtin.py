"""Built-in tools: add checks its integers; the calculator does arithmetic only, within bounds, with short results."""

import pytest

from rlcore.tools.builtin import AddTool, CalculatorTool


def test_add():
    tool = AddTool({}, AddTool.TOOL_SCHEMA)
    assert tool.name == "add" and tool.create("0") == "0"
    assert tool.execute("0", {"a": 2, "b": -5}) == ("-3", None, {})
    with pytest.raises(ValueError, match=r"add takes integers a and b, got a='2' \(str\), b=True \(bool\)"):
        tool.execute("0", {"a": "2", "b": True})
    with pytest.raises(ValueError, match=r"got b=1.5 \(float\)"):
        tool.execute("0", {"a": 1, "b": 1.5})


@pytest.mark.parametrize("expression, text", [
    ("(48 / 2) + 48", "72"), ("6 / 3", "2"), ("7 / 2", "3.5"), ("1 / 3", "0.333333333333"), ("-(2 + 3) * 4", "-20"),
    ("17 // 5 + 17 % 5", "5"), ("2 ** 10", "1024"), ("  3 *\t7 ", "21"), ("0.1 + 0.2", "0.3"), ("2 ** -1", "0.5"),
])
def test_calculator_arithmetic(expression, text):
    assert CalculatorTool({}, CalculatorTool.TOOL_SCHEMA).execute("0", {"expression": expression}) == (text, None, {})


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('ls')", "only numbers, \\+ - \\* / // % \\*\\* and parentheses are allowed, not \"__import__\\('os'\\)"),
    ("x + 1", "not 'x'"), ("True + 1", "not 'True'"), ("'a' * 3", "not \"'a'\""), ("2 ** 1000", "exponent 1000 is larger than 100"),
    ("((9 ** 100) ** 100) ** 100", "result has more than 4096 bits"), ("1 +", "not an arithmetic expression"),
    ("1" * 501, "longer than 500 characters"), ("(-8) ** 0.5", "not a real number"),
])
def test_calculator_refuses_everything_else(expression, message):
    with pytest.raises(ValueError, match=message):
        CalculatorTool({}, CalculatorTool.TOOL_SCHEMA).execute("0", {"expression": expression})


def test_calculator_errors_the_runner_reports():
    tool = CalculatorTool({}, CalculatorTool.TOOL_SCHEMA)
    with pytest.raises(ZeroDivisionError):
        tool.execute("0", {"expression": "1 / 0"})
    with pytest.raises(ValueError, match="calculator takes a string expression, got 3"):
        tool.execute("0", {"expression": 3})
