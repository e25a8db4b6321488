"""How a worker-group call splits its input across ranks and gathers the outputs.

A worker method is tagged with `@register(dispatch_mode=...)`; `WorkerGroup` reads the tag and binds a group
method that (1) dispatches the arguments to every rank, (2) calls the method on all ranks at once (so that
collectives inside it line up) and (3) collects the per-rank results into one value. The controller therefore
reads like the algorithm: `out = actor_rollout.generate_sequences(batch)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

import numpy as np

from rlcore.protocol import DataProto

DISPATCH_ATTR = "_rlcore_dispatch_mode"
MESH_ATTR = "_rlcore_mesh"


class Dispatch(Enum):
    ONE_TO_ALL = "one_to_all"                  # same arguments to every rank; list of per-rank results
    RANK_ZERO = "rank_zero"                    # same arguments to every rank (collectives); rank 0's result
    DP_COMPUTE_PROTO = "dp_compute_proto"      # split DataProto args across ranks (padding), concat results
    DP_COMPUTE_METRICS = "dp_compute_metrics"  # split DataProto args across ranks, average metric dicts


@dataclass(frozen=True)
class DataLayout:
    """Where a rank sits in one data-parallel layout: ranks with the same dp_rank are pieces of one model replica
    (tensor/pipeline peers) and get the same data; `collect` marks the rank whose results stand for the replica."""

    dp_rank: int
    dp_size: int
    collect: bool = True


def register(dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL, mesh: str | None = None) -> Callable:
    """`mesh` names the data-parallel layout a DP_* method splits over (a worker reports it per mesh, e.g. "actor"
    for a Megatron TP x PP engine); None: every rank is its own data-parallel rank."""

    def decorate(fn: Callable) -> Callable:
        setattr(fn, DISPATCH_ATTR, dispatch_mode)
        setattr(fn, MESH_ATTR, mesh)
        return fn

    return decorate


def _split_protos(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], int]:
    """Pads every DataProto argument to a multiple of world_size and deals out contiguous chunks.

    Contiguous chunks keep the n samples of a prompt on one rank, which matters for anything grouped by uid.
    Returns per-rank args/kwargs and the number of padded rows (to strip from the concatenated output).
    """
    num_pad = 0

    def chunks(value: Any) -> list[Any]:
        nonlocal num_pad
        if isinstance(value, DataProto):
            padded, num_pad = value.pad_to_multiple(world_size)
            return padded.chunk(world_size)
        return [value] * world_size

    split_args = [chunks(a) for a in args]
    split_kwargs = {k: chunks(v) for k, v in kwargs.items()}
    per_rank_args = [tuple(a[r] for a in split_args) for r in range(world_size)]
    per_rank_kwargs = [{k: v[r] for k, v in split_kwargs.items()} for r in range(world_size)]
    return per_rank_args, per_rank_kwargs, num_pad


def mean_metrics(per_rank: list[dict[str, float]], collect: list[bool] | None = None) -> dict[str, float]:
    """Averages each metric over the collecting ranks that reported it (one per replica, each holding an equal
    share of the batch); `perf/max_*` peaks take the largest value over every rank, extremes their own
    (metric_reduction)."""
    collect = collect or [True] * len(per_rank)
    keys = sorted({k for m in per_rank for k in m})
    values = lambda k: [m[k] for m, c in zip(per_rank, collect) if k in m and (c or k.startswith("perf/max_"))]  # noqa: E731
    return {k: float(metric_reduction(k)(values(k))) for k in keys if values(k)}


def metric_reduction(key: str):
    """How values of a metric from several ranks, micro- or mini-batches combine: the largest for memory peaks
    (`perf/max_*`) and for extremes (`*_max` of `actor/distillation/`), the smallest for `*_min` there; the mean
    of everything else (the shares a loss function's metrics are)."""
    if key.startswith("perf/max_") or key.startswith("actor/distillation/") and key.endswith("_max"):
        return np.max
    if key.startswith("actor/distillation/") and key.endswith("_min"):
        return np.min
    return np.mean


def dispatch_and_collect(mode: Dispatch, layouts: list[DataLayout], call: Callable[[list[tuple], list[dict]], list[Any]], args: tuple,
                         kwargs: dict) -> Any:
    """Runs one group call on every rank (`call(per_rank_args, per_rank_kwargs)` returns the ranks' results).
    DP modes split DataProto arguments into `dp_size` chunks, give rank r chunk `layouts[r].dp_rank`, and gather
    the collecting ranks' results in dp order."""
    world_size = len(layouts)
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        outputs = call([args] * world_size, [kwargs] * world_size)
        return outputs[0] if mode is Dispatch.RANK_ZERO else outputs
    dp_size = layouts[0].dp_size
    chunk_args, chunk_kwargs, num_pad = _split_protos(dp_size, args, kwargs)
    per_rank_args = [chunk_args[layout.dp_rank] for layout in layouts]
    per_rank_kwargs = [chunk_kwargs[layout.dp_rank] for layout in layouts]
    collect = [layout.collect for layout in layouts]
    if mode is Dispatch.DP_COMPUTE_METRICS:
        if num_pad:
            # Padding would duplicate samples into the gradient; the config validator makes this unreachable.
            raise ValueError(f"training batch does not split evenly over {dp_size} data-parallel ranks (would pad {num_pad} rows)")
        return mean_metrics(call(per_rank_args, per_rank_kwargs), collect)
    outputs = call(per_rank_args, per_rank_kwargs)
    by_replica = sorted(((layout.dp_rank, out) for layout, out in zip(layouts, outputs) if layout.collect), key=lambda pair: pair[0])
    return DataProto.concat([out for _, out in by_replica]).unpad(num_pad)
