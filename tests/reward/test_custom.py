"""load_custom_reward_fn: loading by path and every error a user can hit."""

import textwrap

import pytest

from rlcore.reward.custom import load_custom_reward_fn

GOOD = '''
import re
from dataclasses import dataclass

@dataclass
class Weights:  # dataclasses need the module registered in sys.modules while it executes
    hit: float = 1.0

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return Weights().hit if solution_str.strip() == ground_truth else 0.0

def other(data_source, solution_str, ground_truth, extra_info=None):
    return -1.0

def _private():
    pass
'''


def write(path, source):
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_none_path_returns_none():
    assert load_custom_reward_fn(None) is None


def test_loads_named_function(tmp_path):
    path = write(tmp_path / "reward.py", GOOD)
    fn = load_custom_reward_fn(path)
    assert fn(data_source="x", solution_str=" 5 ", ground_truth="5", extra_info=None) == 1.0
    assert load_custom_reward_fn(path, name="other")("x", "5", "5") == -1.0


def test_same_basename_different_files_do_not_collide(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {}\n"
    fa = load_custom_reward_fn(write(tmp_path / "a" / "reward.py", source.format(1.0)))
    fb = load_custom_reward_fn(write(tmp_path / "b" / "reward.py", source.format(2.0)))
    assert (fa("", "", ""), fb("", "", "")) == (1.0, 2.0)
    assert fa.__module__ != fb.__module__


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="reward.custom_reward_function.path=.*nope.py"):
        load_custom_reward_fn(str(tmp_path / "nope.py"))


def test_syntax_error_is_chained(tmp_path):
    path = write(tmp_path / "bad.py", "def compute_score(:\n")
    with pytest.raises(ImportError, match="bad.py failed to load: SyntaxError") as err:
        load_custom_reward_fn(path)
    assert isinstance(err.value.__cause__, SyntaxError)


def test_import_error_is_chained(tmp_path):
    path = write(tmp_path / "imp.py", "import surely_not_a_module_xyz\n")
    with pytest.raises(ImportError, match="surely_not_a_module_xyz") as err:
        load_custom_reward_fn(path)
    assert isinstance(err.value.__cause__, ModuleNotFoundError)


def test_missing_function_lists_callables(tmp_path):
    path = write(tmp_path / "reward.py", GOOD)
    with pytest.raises(ValueError) as err:
        load_custom_reward_fn(path, name="score")
    msg = str(err.value)
    assert "reward.custom_reward_function.name='score' is not defined" in msg
    assert "['Weights', 'compute_score', 'other']" in msg  # not re's functions, not _private


def test_wrong_signature(tmp_path):
    path = write(tmp_path / "sig.py", "def compute_score(solution_str, ground_truth):\n    return 0.0\n")
    with pytest.raises(ValueError, match="cannot be called as compute_score\\(data_source=..."):
        load_custom_reward_fn(path)
