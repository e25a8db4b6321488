"""Loads a user's reward function from a Python file (custom_reward_function.path / .name)."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

RewardFn = Callable[..., float]


def load_custom_reward_fn(path: str | None, name: str = "compute_score") -> RewardFn | None:
    """Returns `name` from the file at `path`, or None when path is None.

    The function must accept the keywords data_source, solution_str, ground_truth, extra_info (verl's
    convention: `def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float`).
    """
    if path is None:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom_reward_function.path={path} does not exist")

    # One module name per file (not per basename), so two `reward.py` files never shadow each other, and the
    # same name in every process that loads the file, so pickling functions by reference works across them.
    module_name = "rlcore_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"custom_reward_function.path={path} is not a Python source file (.py)")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling inside the user's file look the module up by name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # SyntaxError, ImportError, or anything the file raises at import time
        sys.modules.pop(module_name, None)
        raise ImportError(
            f"custom_reward_function.path={path} failed to load: {type(e).__name__}: {e}"
        ) from e

    fn: Any = getattr(module, name, None)
    if fn is None or not callable(fn):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and getattr(value, "__module__", None) == module_name and not attr.startswith("_")
        )
        what = "is not callable" if fn is not None else "is not defined"
        raise ValueError(
            f"custom_reward_function.name={name!r} {what} in {path}; callables defined there: {defined or 'none'}. "
            f"Set custom_reward_function.name to one of them"
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
