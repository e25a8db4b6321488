"""Full tensors from data-parallel shards in buckets: one all-gather per bucket instead of one per tensor.

A weight sync of a model with hundreds of tensors otherwise pays hundreds of collective latencies (and, on gloo,
hundreds of small messages); verl buckets the same way (`rollout.checkpoint_engine.update_weights_bucket_megabytes`).
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

# torch 2.13 renamed all_gather_into_tensor (a deprecation warning per call); older torch has only the old name.
all_gather_flat = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def _row_sharded(t: torch.Tensor) -> bool:
    """FSDP2's layout: dim 0 split over a 1-D mesh in torch.chunk order (only trailing ranks short)."""
    return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),) and t.dim() > 0


def gather_full_tensors(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) in the order given, on `device`. Collective over the tensors' mesh: every rank iterates.

    Row-sharded DTensors of one dtype are packed into a flat buffer (each rank's rows padded to the largest
    rank's) and gathered at once, as long as their full tensors total at most `bucket_bytes` (or one tensor
    alone); anything else is gathered alone. Peak extra memory is about one bucket of full tensors plus its
    shard. `bucket_bytes=0` gathers tensor by tensor.
    """
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, tensor in named:
        if not _row_sharded(tensor):
            yield from _flush(bucket, device)
            bucket, size = [], 0
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            continue
        nbytes = _padded_rows(tensor) * _row_numel(tensor) * tensor.element_size() * tensor.device_mesh.size()
        if bucket and (size + nbytes > bucket_bytes or tensor.dtype != bucket[0][1].dtype or tensor.device_mesh != bucket[0][1].device_mesh):
            yield from _flush(bucket, device)
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    yield from _flush(bucket, device)


def _padded_rows(t: DTensor) -> int:
    return math.ceil(t.shape[0] / t.device_mesh.size())


def _row_numel(t: DTensor) -> int:
    return math.prod(t.shape[1:])


def _flush(bucket: list[tuple[str, DTensor]], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    if not bucket:
        return
    mesh = bucket[0][1].device_mesh
    world = mesh.size()
    if len(bucket) == 1 or world == 1:
        for name, t in bucket:
            yield name, t.full_tensor()
        return
    widths = [_padded_rows(t) * _row_numel(t) for _, t in bucket]  # each rank's padded share of each tensor
    flat = torch.zeros(sum(widths), dtype=bucket[0][1].dtype, device=device)
    offset = 0
    for (_, t), width in zip(bucket, widths):
        local = t.to_local().reshape(-1)
        flat[offset : offset + local.numel()] = local.to(device)
        offset += width
    gathered = flat.new_empty(world * flat.numel())
    all_gather_flat(gathered, flat, group=mesh.get_group())
    gathered = gathered.view(world, -1)
    offset = 0
    for (name, t), width in zip(bucket, widths):
        # Rank r's rows are [r * padded, r * padded + its rows); the padding sits only after the last real row.
        rows = gathered[:, offset : offset + width].reshape(world * _padded_rows(t), *t.shape[1:])
        yield name, rows[: t.shape[0]]
        offset += width
