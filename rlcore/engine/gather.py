"""Full tensors from data-parallel shards in buckets: one all-gather per bucket instead of one per tensor.

A weight sync of a model with hundreds of tensors otherwise pays hundreds of collective latencies (and, on gloo,
hundreds of small messages); verl buckets the same way (`rollout.checkpoint_engine.update_weights_bucket_megabytes`).
CPU ranks of one host can exchange the buckets through shared memory instead (`rlcore.engine.shm_exchange`).
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from rlcore.utils.dist import all_gather_flat


def _row_sharded(t: torch.Tensor) -> bool:
    """FSDP2's layout: dim 0 split over a 1-D mesh in torch.chunk order (only trailing ranks short)."""
    return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),) and t.dim() > 0


def gather_full_tensors(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, device: torch.device,
                        exchange: "Exchange | None" = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) in the order given, on `device`. Collective over the tensors' mesh: every rank iterates.

    Row-sharded DTensors of one dtype are packed into a flat buffer (each rank's rows padded to the largest
    rank's) and gathered at once, as long as their full tensors total at most `bucket_bytes` (or one tensor
    alone); anything else is gathered alone. Peak extra memory is about one bucket of full tensors plus its
    shard. `bucket_bytes=0` gathers tensor by tensor. `exchange` moves the buckets (default: an all-gather).
    """
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, tensor in named:
        if not _row_sharded(tensor):
            yield from _flush(bucket, device, exchange)
            bucket, size = [], 0
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            continue
        nbytes = _padded_rows(tensor) * _row_numel(tensor) * tensor.element_size() * tensor.device_mesh.size()
        if bucket and (size + nbytes > bucket_bytes or tensor.dtype != bucket[0][1].dtype or tensor.device_mesh != bucket[0][1].device_mesh):
            yield from _flush(bucket, device, exchange)
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    yield from _flush(bucket, device, exchange)


def _padded_rows(t: DTensor) -> int:
    return math.ceil(t.shape[0] / t.device_mesh.size())


def _row_numel(t: DTensor) -> int:
    return math.prod(t.shape[1:])


def _flush(bucket: list[tuple[str, DTensor]], device: torch.device, exchange: "Exchange | None") -> Iterator[tuple[str, torch.Tensor]]:
    if not bucket:
        return
    mesh = bucket[0][1].device_mesh
    world = mesh.size()
    if len(bucket) == 1 or world == 1:
        for name, t in bucket:
            yield name, t.full_tensor()
        return
    exchange = exchange or ALL_GATHER
    widths = [_padded_rows(t) * _row_numel(t) for _, t in bucket]  # each rank's padded share of each tensor
    shards = [t.to_local().reshape(-1).to(device) for _, t in bucket]
    for (name, t), gathered in zip(bucket, exchange.gather_bucket(mesh.get_group(), shards, widths)):
        # Rank r's rows are [r * padded, r * padded + its rows); the padding sits only after the last real row.
        yield name, gathered.reshape(world * _padded_rows(t), *t.shape[1:])[: t.shape[0]]


class Exchange:
    """How a bucket travels. `gather_bucket(group, shards, widths)`: this rank's flat shard of each tensor (at most
    `widths[i]` elements, the largest rank's share) in, `[world, widths[i]]` per tensor out (every rank's share)."""

    def gather_bucket(self, group, shards: list[torch.Tensor], widths: list[int]) -> list[torch.Tensor]:
        world = dist.get_world_size(group)
        flat = shards[0].new_zeros(sum(widths))
        offsets = [0, *itertools.accumulate(widths)][:-1]
        for shard, offset in zip(shards, offsets):
            flat[offset : offset + shard.numel()] = shard
        gathered = flat.new_empty(world * flat.numel())
        all_gather_flat(gathered, flat, group=group)
        gathered = gathered.view(world, -1)  # rank-major: a tensor's rows are strided across the ranks' blocks
        return [gathered[:, offset : offset + width] for offset, width in zip(offsets, widths)]


ALL_GATHER = Exchange()  # the default: one all-gather per bucket over the tensors' process group
