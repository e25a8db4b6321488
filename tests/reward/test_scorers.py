"""Rule scorers: registry dispatch, tiny_add, gsm8k strict / flexible, and the answer extractors beside them."""

import pytest

from rlcore.data.synthetic import TASK_NAME
from rlcore.reward.scorers import (
    TINY_ADD,
    answer_extractor,
    default_compute_score,
    extract_gsm8k_answer,
    gsm8k_score,
    register_answer_extractor,
    register_scorer,
    registered_data_sources,
)


def test_tiny_add_name_matches_task():
    assert TINY_ADD == TASK_NAME


@pytest.mark.parametrize(
    "response, score", [("82", 1.0), (" 82\n", 1.0), ("82.", 0.0), ("8 2", 0.0), ("", 0.0), ("820", 0.0)]
)
def test_tiny_add(response, score):
    assert default_compute_score("tiny_add", response, "82") == score


CALL = '<tool_call>{"name":"add","arguments":{"a":123,"b":456}}</tool_call>'


@pytest.mark.parametrize(
    "response, score",
    [
        (f"{CALL}<tool_response>579</tool_response>{CALL}<tool_response>1368</tool_response>1368", 1.0),
        (f"{CALL}<tool_response>1368</tool_response> 1368\n", 1.0),  # stripped
        ("1368", 1.0),  # no tool call: the whole response is the answer
        (f"{CALL}<tool_response>1368</tool_response>", 0.0),  # the tool's result is not an answer
        (f"{CALL}<tool_response>1368</tool_response>1369", 0.0),
        (f"{CALL}<tool_response>1368</tool_response>{CALL}", 0.0),  # ran out of turns mid-call
        ("1368</tool_response>13", 0.0),  # the LAST </tool_response> counts
    ],
)
def test_tiny_add3(response, score):
    assert default_compute_score("tiny_add3", response, "1368") == score


@pytest.mark.parametrize(
    "response, ground_truth, score",
    [
        ("so 3 + 4 = 7\n#### 7", "7", 1.0),
        ("#### 1,234", "1234", 1.0),  # commas removed
        ("#### -5", "-5", 1.0),  # minus sign
        ("#### 2.5", "2.5", 1.0),
        ("#### 72.", "72", 1.0),  # trailing full stop is not part of the number
        ("#### 3\nwait, no\n#### 4", "4", 1.0),  # the LAST #### wins
        ("#### 4\nactually\n#### 3", "4", 0.0),
        ("#### 8", "7", 0.0),  # formatted but wrong -> format_score (0.0)
        ("the answer is 7", "7", 0.0),  # no ####
        ("####7", "7", 0.0),  # verl's strict format needs the space
    ],
)
def test_gsm8k_strict(response, ground_truth, score):
    assert default_compute_score("openai/gsm8k", response, ground_truth) == score
    assert default_compute_score("gsm8k", response, ground_truth) == score


def test_gsm8k_format_score_and_flexible():
    assert gsm8k_score("#### 8", "7", format_score=0.1) == 0.1
    assert gsm8k_score("no answer", "7", format_score=0.1) == 0.0
    assert gsm8k_score("#### 7", "7", score=2.0) == 2.0
    assert gsm8k_score("3 apples, then 4, so 1,007.", "1007", method="flexible") == 1.0
    assert gsm8k_score("it is -12 degrees", "-12", method="flexible") == 1.0
    assert gsm8k_score("no digits here.", "7", method="flexible") == 0.0
    assert extract_gsm8k_answer("a, b. c", method="flexible") is None
    assert extract_gsm8k_answer("#### 1,000,000 and #### 12", method="strict") == "12"
    with pytest.raises(ValueError, match="method='fuzzy'"):
        extract_gsm8k_answer("#### 1", method="fuzzy")


def test_unknown_data_source_lists_registered():
    with pytest.raises(NotImplementedError) as err:
        default_compute_score("math_dapo", "x", "y")
    msg = str(err.value)
    assert "'math_dapo'" in msg and "reward.custom_reward_function.path" in msg
    assert all(name in msg for name in ("tiny_add", "gsm8k", "openai/gsm8k"))


def test_register_scorer():
    @register_scorer("test_always_half")
    def half(solution_str, ground_truth, extra_info=None):
        return 0.5

    assert "test_always_half" in registered_data_sources()
    assert default_compute_score("test_always_half", "", "", {"k": 1}) == 0.5
    with pytest.raises(ValueError, match="already has scorer"):
        register_scorer("tiny_add")(half)


def test_answer_extractors_give_what_the_scorer_compares():
    assert answer_extractor("tiny_add")(" 82\n") == "82"
    assert answer_extractor("tiny_add3")("<tool_response>12</tool_response>3</tool_response> 1368\n") == "1368"
    for source in ("gsm8k", "openai/gsm8k"):
        extract = answer_extractor(source)
        assert extract("so 1000 in all\n#### 1,000.") == "1000" and extract("#### 3\n#### -4") == "-4"
        assert extract("the answer is 7") is None  # strict format, as gsm8k_score: no `#### `, no answer
    assert answer_extractor("math_dapo") is None  # no extractor: validation has no maj@k for it


def test_register_answer_extractor():
    @register_answer_extractor("test_first_word")
    def first_word(solution_str):
        return solution_str.split()[0] if solution_str.split() else None

    assert answer_extractor("test_first_word")("yes, sure") == "yes,"
    with pytest.raises(ValueError, match=r"already has answer_extractor tiny_add_answer; override it with a compute_score that returns"):
        register_answer_extractor("tiny_add")(first_word)
    with pytest.raises(ValueError, match="at least one data_source"):
        register_answer_extractor()


@pytest.mark.parametrize("response, ground_truth, score", [
    ("<think>angles sum to 180</think> so x = \\boxed{60}", "60", 1.0),
    ("<think>.</think>\\boxed{60^\\circ}", "60", 1.0),  # degrees spelled out
    ("<think>.</think>\\boxed{\\frac{3}{4}}", "0.75", 1.0),  # by value
    ("<think>.</think>\\boxed{2\\sqrt{3}}", "2 \\sqrt { 3 }", 1.0),  # spacing
    ("the answer is \\boxed{60}", "60", 0.9),  # right, no <think> format
    ("<think>.</think>\\boxed{61}", "60", 0.1),  # format only
    ("<think>.</think> 60", "60", 0.0),  # no box: no answer
])
def test_geo3k_is_verls_answer_and_format_score(response, ground_truth, score):
    from rlcore.reward.scorers import default_compute_score

    assert default_compute_score("hiyouga/geometry3k", response, ground_truth) == pytest.approx(score)
