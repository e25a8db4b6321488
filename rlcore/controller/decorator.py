"""How a worker-group call splits its input across ranks and gathers the outputs.

A worker method is tagged with `@register(dispatch_mode=...)`; `WorkerGroup` reads the tag and binds a group
method that (1) dispatches the arguments to every rank, (2) calls the method on all ranks at once (so that
collectives inside it line up) and (3) collects the per-rank results into one value. The controller therefore
reads like the algorithm: `out = actor_rollout.generate_sequences(batch)`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable

import numpy as np

from rlcore.protocol import DataProto

DISPATCH_ATTR = "_rlcore_dispatch_mode"


class Dispatch(Enum):
    ONE_TO_ALL = "one_to_all"                  # same arguments to every rank; list of per-rank results
    RANK_ZERO = "rank_zero"                    # same arguments to every rank (collectives); rank 0's result
    DP_COMPUTE_PROTO = "dp_compute_proto"      # split DataProto args across ranks (padding), concat results
    DP_COMPUTE_METRICS = "dp_compute_metrics"  # split DataProto args across ranks, average metric dicts


def register(dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL) -> Callable:
    def decorate(fn: Callable) -> Callable:
        setattr(fn, DISPATCH_ATTR, dispatch_mode)
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


def mean_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Averages each metric over the ranks that reported it (ranks hold equal shares of the batch); `perf/max_*`
    peaks take the largest rank's value."""
    keys = sorted({k for m in per_rank for k in m})
    reduce = lambda k: np.max if k.startswith("perf/max_") else np.mean  # noqa: E731
    return {k: float(reduce(k)([m[k] for m in per_rank if k in m])) for k in keys}


def dispatch_and_collect(mode: Dispatch, world_size: int, call: Callable[[list[tuple], list[dict]], list[Any]], args: tuple, kwargs: dict) -> Any:
    """Runs one group call: `call(per_rank_args, per_rank_kwargs)` must execute on all ranks and return their results."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        outputs = call([args] * world_size, [kwargs] * world_size)
        return outputs[0] if mode is Dispatch.RANK_ZERO else outputs
    per_rank_args, per_rank_kwargs, num_pad = _split_protos(world_size, args, kwargs)
    if mode is Dispatch.DP_COMPUTE_METRICS:
        if num_pad:
            # Padding would duplicate samples into the gradient; the config validator makes this unreachable.
            raise ValueError(f"training batch does not split evenly over {world_size} ranks (would pad {num_pad} rows)")
        return mean_metrics(call(per_rank_args, per_rank_kwargs))
    outputs = call(per_rank_args, per_rank_kwargs)
    return DataProto.concat(outputs).unpad(num_pad)
