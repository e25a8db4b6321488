"""Loads a user's reward function from a Python file (reward.custom_reward_function.path / .name)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rlcore.utils.import_file import import_file

RewardFn = Callable[..., float]


def load_custom_reward_fn(path: str | None, name: str = "compute_score") -> RewardFn | None:
    """Returns `name` from the file at `path`, or None when path is None.

    The function must accept the keywords data_source, solution_str, ground_truth, extra_info (verl's
    convention: `def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float`).
    """
    if path is None:
        return None
    module = import_file(path, "reward.custom_reward_function.path")
    module_name = module.__name__
    fn: Any = getattr(module, name, None)
    if fn is None or not callable(fn):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and getattr(value, "__module__", None) == module_name and not attr.startswith("_")
        )
        what = "is not callable" if fn is not None else "is not defined"
        raise ValueError(
            f"reward.custom_reward_function.name={name!r} {what} in {path}; callables defined there: {defined or 'none'}. "
            f"Set reward.custom_reward_function.name to one of them"
        )
    _check_signature(fn, path, name)
    return fn


def _check_signature(fn: Callable[..., Any], path: str, name: str) -> None:
    """Fails at load time, not at the first reward call, when fn cannot take the reward arguments by keyword
    (reward managers call it as fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...))."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info=None)
    except TypeError as e:
        raise ValueError(
            f"custom_reward_function {name}{signature} in {path} cannot be called as "
            f"{name}(data_source=..., solution_str=..., ground_truth=..., extra_info=...): {e}"
        ) from e
