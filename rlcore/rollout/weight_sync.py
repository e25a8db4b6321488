"""Hybrid engine: move the trainer's current weights into the rollout engine before each generation."""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from rlcore.rollout.base import WEIGHT_BUCKET_BYTES, RolloutEngine, WeightSource


def sync_weights(engine: WeightSource, rollout: RolloutEngine, bucket_bytes: int = WEIGHT_BUCKET_BYTES, adapted_only: bool = False,
                 release: Callable[[], None] = lambda: None, stats: dict | None = None, trainable_only: bool = False) -> int:
    """Streams every training weight into the rollout engine; returns the number of tensors sent. With LoRA the
    adapted weights arrive merged, and `adapted_only` sends only those (the rollout already holds the frozen rest);
    `trainable_only` leaves out the parameters that take no gradient (a frozen vision tower the rollout holds).

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
        # each tensor is copied in before the next is drawn
        for name, tensor in engine.rollout_weights(bucket_bytes, transient=True, adapted_only=adapted_only, trainable_only=trainable_only):
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


def sync_adapters(engine: WeightSource, rollout: RolloutEngine, with_base: bool, bucket_bytes: int = WEIGHT_BUCKET_BYTES,
                  release: Callable[[], None] = lambda: None, stats: dict | None = None) -> int:
    """LoRA without merging (`model.lora.merge=False`): the frozen base once (`with_base`, the first sync: the
    rollout keeps it from then on, asleep at level 1), then at every sync the adapters alone, which the rollout
    applies over it. Returns the number of tensors sent; `stats` as sync_weights's, plus `adapter_bytes`.
    Collective, and in sync_weights's order (weights in, release the training side, then the KV cache)."""
    stats = {} if stats is None else stats
    stats.update(bytes=0, largest=0)
    sent = 0
    rollout.wake_up(["weights"])
    if with_base:
        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal sent
            for name, tensor in engine.rollout_weights(bucket_bytes, transient=True, unmerged=True):
                sent += 1
                stats["bytes"] += tensor.numel() * tensor.element_size()
                stats["largest"] = max(stats["largest"], tensor.numel() * tensor.element_size())
                yield name, tensor

        rollout.update_weights(counted())
    adapters = engine.rollout_adapters()
    rollout.load_adapters(adapters)
    sent += len(adapters.tensors)
    stats["adapter_bytes"] = adapters.nbytes
    stats["bytes"] += adapters.nbytes
    stats["largest"] = max([stats["largest"], *(t.numel() * t.element_size() for t in adapters.tensors.values())])
    release()
    rollout.wake_up(["kv_cache"])
    return sent


# ----------------------------------------------------------------------------------------- between pools
# With split pools (actor_rollout_ref.hybrid_engine=False) the rollout's weights live in other processes, on other
# devices. The training ranks gather full tensors as for the hybrid engine (a collective of their own group), and
# training rank 0 broadcasts them, a bucket at a time, over a group spanning it and every rollout rank
# (rlcore.utils.dist.standalone_group): one small message naming the bucket's tensors, then the bucket as one flat
# byte buffer. Peak extra memory on either side is one bucket; a sync costs the same at every step.


def send_weights(engine: WeightSource, group, rank: int, bucket_bytes: int = WEIGHT_BUCKET_BYTES, stats: dict | None = None) -> int:
    """Training side: every training rank calls it (the gather is collective); rank 0, the cross-pool group's root,
    sends. Returns the number of tensors sent."""
    from rlcore.utils.dist import group_broadcast, group_broadcast_object

    stats = {} if stats is None else stats
    stats.update(bytes=0, largest=0, buckets=0)
    bucket: list[tuple[str, torch.Tensor]] = []
    held, sent = 0, 0

    def flush() -> None:
        nonlocal bucket, held
        if bucket:
            group_broadcast_object(group, [(name, t.shape, t.dtype) for name, t in bucket], 0, 0)
            group_broadcast(group, torch.cat([t.reshape(-1).view(torch.uint8) for _, t in bucket]), 0)
            stats["buckets"] += 1
        bucket, held = [], 0

    for name, tensor in engine.rollout_weights(bucket_bytes, transient=True):
        sent += 1
        if rank != 0:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if held and held + nbytes > bucket_bytes:
            flush()
        bucket.append((name, tensor.detach().contiguous().clone()))  # transient: the engine reuses its buffer
        held += nbytes
        stats["bytes"] += nbytes
        stats["largest"] = max(stats["largest"], nbytes)
    if rank == 0:
        flush()
        group_broadcast_object(group, None, 0, 0)  # the end of this sync
    return sent


def receive_weights(group, rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Rollout side: the tensors training rank 0 sends, one bucket at a time (each rollout rank feeds its own
    engine; a tensor is valid until the next bucket arrives)."""
    from rlcore.utils.dist import group_broadcast, group_broadcast_object

    while True:
        names = group_broadcast_object(group, None, 0, rank)
        if names is None:
            return
        sizes = [shape.numel() * torch.empty((), dtype=dtype).element_size() for _, shape, dtype in names]
        flat = group_broadcast(group, torch.empty(sum(sizes), dtype=torch.uint8), 0)
        offset = 0
        for (name, shape, dtype), size in zip(names, sizes):
            yield name, flat[offset:offset + size].view(dtype).reshape(shape)
            offset += size
