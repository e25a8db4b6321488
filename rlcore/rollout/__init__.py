"""Rollout engines behind one interface (native embedded engine, vLLM adapter) and hybrid-engine weight sync."""

from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, assemble_sequences
from rlcore.rollout.factory import build_rollout

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams", "assemble_sequences", "build_rollout"]
