"""Rollout engines behind one interface (native embedded engine, vLLM adapter) and hybrid-engine weight sync.

The names below load on first use: the planner imports `rlcore.rollout.sizing` (torch-free) without pulling in the
engines and torch with them."""

from __future__ import annotations

import importlib

_EXPORTS = {"RolloutEngine": "rlcore.rollout.base", "RolloutOutput": "rlcore.rollout.base", "SamplingParams": "rlcore.rollout.base",
            "assemble_sequences": "rlcore.rollout.base", "build_rollout": "rlcore.rollout.factory"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlcore.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
