"""Hybrid engine: move the trainer's current weights into the rollout engine before each generation."""

from __future__ import annotations

from typing import Iterator

import torch

from rlcore.engine.base import TrainEngine
from rlcore.rollout.base import RolloutEngine


def sync_weights(engine: TrainEngine, rollout: RolloutEngine) -> int:
    """Streams every training weight into the rollout engine; returns the number of tensors sent.

    The engine gathers one full tensor at a time and the rollout copies it into place before the next is
    gathered, so peak extra memory is one unsharded tensor, never a second full copy of the model.
    Collective: every rank of the training group must call it (each rank feeds its own rollout replica).
    The order follows vLLM's in-place reload: wake the weights, load them all, then wake the KV cache.
    """
    sent = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal sent
        for name, tensor in engine.rollout_weights():
            sent += 1
            yield name, tensor

    rollout.wake_up(["weights"])
    rollout.update_weights(counted())
    rollout.wake_up(["kv_cache"])
    return sent
