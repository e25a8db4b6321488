"""Collectives place their tensors on the group's device (NCCL refuses CPU tensors), and nothing in rlcore calls a
tensor collective around rlcore.utils.dist, so the CPU-counter-on-NCCL crash cannot come back unseen."""

import ast
import pathlib

import torch
import torch.distributed as dist
from dist_utils import free_port, init_gloo

import rlcore
from rlcore.utils import dist as rdist

TENSOR_COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
}
# The megatron CPU shim runs only on CPU (gloo), where it exchanges pipeline shapes as CPU tensors on purpose.
ALLOWED = {"utils/dist.py", "engine/megatron/cpu_shim.py"}


def direct_collective_calls() -> list[str]:
    root = pathlib.Path(rlcore.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TENSOR_COLLECTIVES
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "dist"):
                found.append(f"rlcore/{rel}:{node.lineno} dist.{node.func.attr}")
    return found


def test_no_tensor_collective_bypasses_the_device_placing_helpers():
    found = direct_collective_calls()
    assert not found, ("tensor collectives must go through rlcore.utils.dist (all_reduce, all_reduce_values, all_gather_flat, "
                       f"broadcast), which put the tensor on the process group's device: {found}")


def test_the_scan_sees_a_direct_call(tmp_path, monkeypatch):
    """The check itself works: a module with a direct call is reported."""
    pkg = tmp_path / "rlcore"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("import torch.distributed as dist\ndef f(t):\n    dist.all_reduce(t)\n")
    monkeypatch.setattr(rlcore, "__file__", str(pkg / "__init__.py"))
    assert direct_collective_calls() == ["rlcore/bad.py:3 dist.all_reduce"]


def test_nccl_groups_want_the_current_cuda_device(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert rdist.group_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert rdist.group_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert rdist.group_device() == torch.device("cpu")


def test_helpers_reduce_and_gather_on_a_gloo_group():
    init_gloo(0, 1, free_port())
    assert rdist.group_device() == torch.device("cpu")
    assert rdist.all_reduce_values([3, -5], op=rdist.ReduceOp.MAX) == [3.0, -5.0]
    t = torch.tensor([1.5, 2.0])
    assert rdist.all_reduce(t) is t and t.tolist() == [1.5, 2.0]
    out = torch.empty(2)
    rdist.all_gather_flat(out, torch.tensor([4.0, 5.0]))
    assert out.tolist() == [4.0, 5.0]
    assert rdist.broadcast(torch.tensor([7.0]), src=0).tolist() == [7.0]
    transposed = torch.arange(6.0).view(2, 3).t()  # a view whose memory order differs from its shape's
    assert rdist.all_to_all(transposed).tolist() == transposed.tolist()


def _hang_in_a_subgroup(rank: int, port: int, out: str) -> None:
    import os
    import time

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=rdist.set_collective_timeout(2))
    group = dist.new_group([0, 1])  # as FSDP2's and Ulysses' meshes are made: no timeout of its own
    if rank == 1:
        time.sleep(6)  # never joins the all-reduce: a hung peer
        os._exit(0)  # (gloo may abort tearing down a pair whose operation timed out: no destructors)
    start = time.perf_counter()
    try:
        rdist.all_reduce(torch.ones(1), group=group)
        failed = None
    except RuntimeError as err:
        failed = str(err)
    torch.save({"seconds": time.perf_counter() - start, "error": failed, "after_minutes": rdist.collective_timeout_minutes()}, out)
    os._exit(0)


def test_nccl_timeout_bounds_a_hung_collective_in_every_group(tmp_path):
    """actor_rollout_ref.nccl_timeout (2 s here) ends a collective whose peer never comes, in a sub-group too;
    without it a new group would wait torch's 30 minutes."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "r.pt")
    mp.spawn(_hang_in_a_subgroup, args=(free_port(), out), nprocs=2, join=True)
    result = torch.load(out)
    assert result["error"] is not None, "the collective did not time out"
    assert 1.5 <= result["seconds"] <= 5, result
    assert result["after_minutes"] == 1  # megatron-core's groups get it rounded up to whole minutes
