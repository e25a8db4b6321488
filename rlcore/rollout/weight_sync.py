"""Hybrid engine: stream the trainer's current weights into the rollout engine before each generation."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from rlcore.engine.base import TrainEngine
from rlcore.rollout.base import RolloutEngine


def buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups (name, tensor) pairs into lists of about `bucket_bytes` (a tensor larger than that goes alone).

    Buckets bound memory (at most one bucket of gathered tensors is alive) while keeping the per-call overhead
    of engines like vLLM, whose reload wants whole layers, low.
    """
    bucket, size = [], 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def sync_weights(engine: TrainEngine, rollout: RolloutEngine, bucket_megabytes: int) -> int:
    """Loads every training weight into the rollout engine; returns the number of tensors sent.

    Collective: every rank of the training group must call it (each gathers the full tensors it then loads).
    """
    sent = 0
    for bucket in buckets(engine.rollout_weights(), bucket_megabytes << 20):
        rollout.update_weights(bucket)
        sent += len(bucket)
    return sent
