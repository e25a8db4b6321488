"""Rule scorers, looked up by a row's `data_source`.

A scorer maps (solution_str, ground_truth, extra_info) to a float reward. `default_compute_score` is what the
reward manager calls when no reward.custom_reward_function.path is configured.

An answer extractor, registered per data_source next to its scorer, maps a response to its final answer (a str,
None if it gave none). The reward manager adds it to the scorer's extras as "pred" when the scorer returned none,
and validation takes the majority vote over it (`maj@k`, rlcore.trainer.val_metrics).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

Scorer = Callable[..., float]
AnswerExtractor = Callable[[str], str | None]
_SCORERS: dict[str, Scorer] = {}
_EXTRACTORS: dict[str, AnswerExtractor] = {}

# Must equal rlcore.data.synthetic.TASK_NAME (a test checks it); not imported so that scorers stay importable
# without pyarrow / torch, e.g. in light reward-worker processes.
TINY_ADD = "tiny_add"
# Must equal rlcore.data.synthetic_tools.TASK_NAME (a test checks it): three 3-digit numbers, solved with a tool.
TINY_ADD3 = "tiny_add3"


def _register(table: dict[str, Callable], kind: str, data_sources: tuple[str, ...], override: str) -> Callable[[Callable], Callable]:
    if not data_sources:
        raise ValueError(f"register_{kind} needs at least one data_source name")

    def decorator(fn: Callable) -> Callable:
        for name in data_sources:
            if name in table and table[name] is not fn:
                raise ValueError(
                    f"data_source {name!r} already has {kind} {table[name].__qualname__}; override it with {override} instead"
                )
            table[name] = fn
        return fn

    return decorator


def register_scorer(*data_sources: str) -> Callable[[Scorer], Scorer]:
    """Decorator: `@register_scorer("gsm8k", "openai/gsm8k")` makes fn the scorer for those data sources."""
    return _register(_SCORERS, "scorer", data_sources, "reward.custom_reward_function.path")


def register_answer_extractor(*data_sources: str) -> Callable[[AnswerExtractor], AnswerExtractor]:
    """Decorator: `@register_answer_extractor("gsm8k")` makes fn(solution_str) -> answer | None the data sources'
    answer extractor (what majority voting compares)."""
    return _register(_EXTRACTORS, "answer_extractor", data_sources, 'a compute_score that returns {"score": ..., "pred": ...}')


def answer_extractor(data_source: str) -> AnswerExtractor | None:
    """The data source's registered answer extractor; None if it has none (then validation has no maj@k for it)."""
    return _EXTRACTORS.get(data_source)


def registered_data_sources() -> list[str]:
    return sorted(_SCORERS)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    """Scores one response with the scorer registered for its data_source."""
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"no rule scorer for data_source={data_source!r}; registered: {registered_data_sources()}. "
            f"Register one with @register_scorer or point reward.custom_reward_function.path at a file defining "
            f"compute_score(data_source, solution_str, ground_truth, extra_info=None)"
        )
    return float(scorer(solution_str, ground_truth, extra_info))


@register_scorer(TINY_ADD)
def tiny_add_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """1.0 iff the response, whitespace stripped, is exactly the ground-truth sum."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


@register_scorer("tiny_colour")
def tiny_colour_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """The synthetic image task (rlcore.data.synthetic_vision): 1.0 iff the response, stripped, is the colour's name."""
    return 1.0 if solution_str.strip().lower() == str(ground_truth).strip() else 0.0


@register_answer_extractor(TINY_ADD)
def tiny_add_answer(solution_str: str) -> str:
    """The whole response, whitespace stripped: what tiny_add_score compares."""
    return solution_str.strip()


@register_answer_extractor(TINY_ADD3)
def tiny_add3_answer(solution_str: str) -> str:
    """The text after the last `</tool_response>` (the whole response if no tool answered), whitespace stripped.

    The response is the whole multi-turn trajectory decoded without special tokens, e.g.
    `<tool_call>..</tool_call><tool_response>579</tool_response><tool_call>..</tool_call><tool_response>1368</tool_response>1368`,
    so the final assistant turn is what follows the last tool response.
    """
    return solution_str.rpartition("</tool_response>")[2].strip()


@register_scorer(TINY_ADD3)
def tiny_add3_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """1.0 iff the final answer (tiny_add3_answer) is exactly the ground-truth sum; the tool calls are not graded."""
    return 1.0 if tiny_add3_answer(solution_str) == str(ground_truth).strip() else 0.0


# verl's strict format: "#### " then the number (minus sign, digits, dots, commas).
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
# Any number with at least one digit; "," or "." alone (sentence punctuation) never counts.
_NUMBER = re.compile(r"\-?[0-9\.\,]*[0-9][0-9\.\,]*")


def _normalize_number(text: str) -> str:
    """Drops thousands separators, `$` and a trailing sentence full stop: "1,000." -> "1000"."""
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_gsm8k_answer(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The final answer: the LAST `#### <number>` (strict) or the last number anywhere (flexible); None if absent."""
    if method == "strict":
        found = _GSM8K_STRICT.findall(solution_str)
    elif method == "flexible":
        found = _NUMBER.findall(solution_str)
    else:
        raise ValueError(f"gsm8k method={method!r} is not one of ('strict', 'flexible')")
    return _normalize_number(found[-1]) if found else None


@register_answer_extractor("openai/gsm8k", "gsm8k")
def gsm8k_answer(solution_str: str) -> str | None:
    """The strict-format answer gsm8k_score compares by default (normalised), None without a `#### <number>`."""
    return extract_gsm8k_answer(solution_str, "strict")


@register_scorer("openai/gsm8k", "gsm8k")
def gsm8k_score(
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    *,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals ground_truth (both normalised), `format_score` if an answer was
    found but is wrong, 0.0 if none was found."""
    answer = extract_gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == _normalize_number(str(ground_truth)) else format_score


# Geometry3K (verl's geo3k data source): 0.9 for the right answer in the last \boxed{}, plus 0.1 for the format
# (reasoning in <think> </think> before the box), as verl scores it. Answers are compared after normalising LaTeX
# spelling (spaces, \left / \right, degrees, \text{}) and, where both sides are numbers (decimals, a/b,
# \frac{a}{b}), by value; verl's mathruler grader also decides symbolic equivalence, which this does not.
GEO3K_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1: j]
    return None


def _math_value(text: str) -> float | None:
    text = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"(\1)/(\2)", text)
    if not re.fullmatch(r"[0-9.+\-*/() ]+", text):
        return None
    try:
        return float(eval(text, {"__builtins__": {}}, {}))  # digits and arithmetic only (checked above)
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError):
        return None


def _normalize_math(text: str) -> str:
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    for token in ("\\left", "\\right", "^\\circ", "^{\\circ}", "\\circ", "°", "\\!", "\\,", "$", " "):
        text = text.replace(token, "")
    return text.rstrip(".")


def math_answers_equal(answer: str, truth: str) -> bool:
    a, b = _normalize_math(answer), _normalize_math(truth)
    if a == b:
        return True
    x, y = _math_value(a), _math_value(b)
    return x is not None and y is not None and abs(x - y) <= 1e-6 * max(1.0, abs(y))


@register_answer_extractor("hiyouga/geometry3k", "geo3k")
def geo3k_answer(solution_str: str) -> str | None:
    return last_boxed(solution_str)


@register_scorer("hiyouga/geometry3k", "geo3k")
def geo3k_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, *,
                format_score: float = 0.1) -> float:
    answer = last_boxed(solution_str)
    right = answer is not None and math_answers_equal(answer, str(ground_truth))
    return (1.0 - format_score) * right + format_score * bool(GEO3K_FORMAT.fullmatch(solution_str))

