"""Hybrid engine: move the trainer's current weights into the rollout engine before each generation."""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from rlcore.rollout.base import WEIGHT_BUCKET_BYTES, RolloutEngine, WeightSource


def sync_weights(engine: WeightSource, rollout: RolloutEngine, bucket_bytes: int = WEIGHT_BUCKET_BYTES, adapted_only: bool = False,
                 release: Callable[[], None] = lambda: None, stats: dict | None = None) -> int:
    """Streams every training weight into the rollout engine; returns the number of tensors sent. With LoRA the
    adapted weights arrive merged, and `adapted_only` sends only those (the rollout already holds the frozen rest).

    The engine gathers full tensors a bucket at a time (one collective per `bucket_bytes`) and the rollout copies
    each into place, so peak extra memory is one bucket of unsharded tensors, never a second copy of the model.
    Collective: every rank of the training group must call it (each rank feeds its own rollout replica).
    The order is verl's hybrid engine's: wake the rollout's weights, stream every weight in, `release()` the
    training side (the worker offloads the actor's parameters there), and only then wake the KV cache, so the
    cache never shares the device with the training parameters (rlcore.workers.phases). `stats`, when given,
    receives the bytes streamed and the largest tensor: the bucket a sync really gathers is the smaller of
    `bucket_bytes` and the model, or one tensor larger than a bucket.
    """
    sent = 0
    stats = {} if stats is None else stats
    stats.update(bytes=0, largest=0)

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal sent
        for name, tensor in engine.rollout_weights(bucket_bytes, transient=True, adapted_only=adapted_only):  # each is copied in before the next
            sent += 1
            nbytes = tensor.numel() * tensor.element_size()
            stats["bytes"] += nbytes
            stats["largest"] = max(stats["largest"], nbytes)
            yield name, tensor

    rollout.wake_up(["weights"])
    rollout.update_weights(counted())
    release()
    rollout.wake_up(["kv_cache"])
    return sent
