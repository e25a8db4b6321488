"""Picks a training engine by the role's `strategy` key; the only module that imports the implementations."""

from __future__ import annotations

import torch

from rlcore.engine.base import EngineSpec, TrainEngine


def build_engine(strategy: str, spec: EngineSpec, device: torch.device, key: str = "actor_rollout_ref.actor.strategy") -> TrainEngine:
    if strategy in ("fsdp", "fsdp2"):
        from rlcore.engine.fsdp2 import FSDP2Engine

        return FSDP2Engine(spec, device)
    if strategy == "megatron":
        from rlcore.engine.megatron import MegatronEngine

        return MegatronEngine(spec, device)
    raise ValueError(f"{key}={strategy!r} is not a training backend of rlcore; use fsdp2 (or fsdp) or megatron")
