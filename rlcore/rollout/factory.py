"""Picks a rollout engine by `actor_rollout_ref.rollout.name`; the only module that imports the implementations."""

from __future__ import annotations

from rlcore.rollout.base import RolloutEngine


def build_rollout(name: str, **kwargs) -> RolloutEngine:
    if name in ("native", "hf"):
        from rlcore.rollout.native import NativeRollout

        return NativeRollout(**kwargs)
    if name == "vllm":
        from rlcore.rollout.vllm import VLLMRollout

        return VLLMRollout(**kwargs)
    raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not supported by rlcore; use native or vllm")
