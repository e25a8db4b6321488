"""tests/durations.py: what `make test-durations` names against the baseline."""

from durations import BUDGET_S, baseline_of, compare


def run(wall_s: float, **tests: float) -> dict:
    return {"wall_s": wall_s, "args": ["tests"], "tests": {f"tests/t.py::{k}": v for k, v in tests.items()}}


def test_the_baseline_names_tests_of_a_second_or_more_and_sums_the_rest():
    base = baseline_of(run(100.0, slow=30.0, quick=0.4, quicker=0.2))
    assert base["tests"] == {"tests/t.py::slow": 30.0}
    assert base["rest"] == {"count": 2, "seconds": 0.6}


def test_a_test_grows_when_both_slower_by_half_and_by_five_seconds():
    base = baseline_of(run(100.0, doubled=10.0, noisy=10.0, tiny=2.0, gone=5.0))
    lines = compare(run(BUDGET_S + 60, doubled=20.0, noisy=14.0, tiny=4.0, new_slow=8.0, new_quick=1.0), base)
    text = "\n".join(lines)
    assert "OVER it here" in lines[2]
    assert "grew (> 1.5x and > +5 s): 1\n     10.0 s ->    20.0 s  tests/t.py::doubled" in text  # not noisy (1.4x), not tiny (+2 s)
    assert "new, 5 s or more: 1\n      8.0 s  tests/t.py::new_slow" in text
    assert "in the baseline, not in the last run: 1" in text
