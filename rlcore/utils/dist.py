"""Tensor collectives that put their tensor where the process group's backend can take it.

NCCL refuses CPU tensors ("No backend type associated with device type cpu"), and the CPU suite, on gloo, never
notices a counter built with `torch.tensor([...])` on the host: that is how `use_dynamic_bsz=True` first crashed on a
GPU. Every tensor collective in rlcore therefore goes through this module, which moves a tensor to the group's
device when it is elsewhere (and the result back), and `tests/utils/test_dist.py` fails on a direct `dist.<op>(...)`
call anywhere else in the package. Object collectives (`all_gather_object`, ...) place their own buffers and stay
direct calls.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp


def group_device(group=None) -> torch.device:
    """The device a tensor must be on for a collective over `group`: the current CUDA device for an NCCL group
    (or a mixed "cpu:gloo,cuda:nccl" one, when CUDA is there), else the CPU."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _on_group_device(tensor: torch.Tensor, group) -> tuple[torch.Tensor, bool]:
    device = group_device(group)
    if tensor.device.type == device.type:
        return tensor, False
    return tensor.to(device), True


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """In-place all-reduce of `tensor` wherever it lives; returns it."""
    moved, copied = _on_group_device(tensor, group)
    dist.all_reduce(moved, op=op, group=group)
    if copied:
        tensor.copy_(moved)
    return tensor


def all_reduce_values(values: Sequence[float], op=ReduceOp.SUM, group=None, dtype: torch.dtype = torch.float64) -> list[float]:
    """Python numbers reduced over the group (the counts and flags that decide control flow on every rank).
    float64 holds every integer count below 2**53 exactly."""
    t = torch.tensor(list(values), dtype=dtype, device=group_device(group))
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """`output` (1-D, world x numel) <- every rank's 1-D `tensor`, rank-major."""
    moved_out, out_copied = _on_group_device(output, group)
    moved_in, _ = _on_group_device(tensor, group)
    _ALL_GATHER_SINGLE(moved_out, moved_in, group=group)
    if out_copied:
        output.copy_(moved_out)


def all_to_all(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """`tensor`'s dim 0 split into world equal chunks, chunk j sent to rank j; returns the chunks received, in rank
    order, on `tensor`'s device. Contiguous first: an `empty_like` of a transposed view keeps its strides, and the
    collective writes in memory order."""
    moved, copied = _on_group_device(tensor.contiguous(), group)
    out = torch.empty_like(moved)
    dist.all_to_all_single(out, moved, group=group)
    return out.to(tensor.device) if copied else out


def broadcast(tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """In-place broadcast from global rank `src`; returns `tensor`."""
    moved, copied = _on_group_device(tensor, group)
    dist.broadcast(moved, src=src, group=group)
    if copied:
        tensor.copy_(moved)
    return tensor


def standalone_group(host: str, port: int, rank: int, world_size: int, device: torch.device, timeout_s: float = 1800.0):
    """A process group of its own, beside each process's default one: the ranks of two worker groups (the trainer's
    and the rollout's pools) cannot join each other's default group, so the weight stream between them gets this
    one. Rank 0 hosts the rendezvous store at `host:port`; the call returns once all `world_size` ranks joined.
    NCCL on a CUDA device, gloo otherwise. Its collectives are the `group_*` functions below."""
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, world_size)
    return dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timedelta(seconds=timeout_s))


def group_broadcast(group, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """In-place broadcast over a `standalone_group` from its rank `root`; returns `tensor`."""
    device = torch.device("cuda", torch.cuda.current_device()) if isinstance(group, getattr(dist, "ProcessGroupNCCL", ())) else torch.device("cpu")
    moved = tensor if tensor.device.type == device.type else tensor.to(device)
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    group.broadcast([moved], opts).wait()
    if moved is not tensor:
        tensor.copy_(moved)
    return tensor


def group_broadcast_object(group, obj: Any, root: int, rank: int) -> Any:
    """`obj` of rank `root`, on every rank of a `standalone_group` (pickled: its length, then its bytes)."""
    payload = pickle.dumps(obj) if rank == root else b""
    size = group_broadcast(group, torch.tensor([len(payload)], dtype=torch.int64), root)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if rank == root else torch.empty(int(size.item()), dtype=torch.uint8)
    return pickle.loads(group_broadcast(group, data, root).numpy().tobytes())


# torch 2.13 renamed all_gather_into_tensor (a deprecation warning per call); older torch has only the old name.
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def set_collective_timeout(seconds: float) -> timedelta:
    """Makes `seconds` the timeout of every process group this process creates from now on, not only of the world
    group that init_process_group is given it for: torch's new_group (and so DeviceMesh, FSDP2's meshes, Ulysses'
    groups, megatron-core's groups unless it passes its own) takes its backend's module default otherwise (30 min
    on gloo, 10 on NCCL), so a hung collective in a sub-group would outlast actor_rollout_ref.nccl_timeout."""
    from torch.distributed import distributed_c10d

    timeout = timedelta(seconds=seconds)
    distributed_c10d.default_pg_timeout = timeout
    if isinstance(getattr(distributed_c10d, "default_pg_nccl_timeout", None), timedelta):
        distributed_c10d.default_pg_nccl_timeout = timeout
    return timeout


def collective_timeout_minutes() -> int:
    """The timeout set_collective_timeout made the default, in whole minutes (megatron-core's unit), rounded up."""
    from torch.distributed import distributed_c10d

    return max(1, -(-int(distributed_c10d.default_pg_timeout.total_seconds()) // 60))
