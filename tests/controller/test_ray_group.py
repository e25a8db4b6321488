"""Real Ray actors on a placement group form a gloo process group and obey the dispatch modes."""

import sys
import time

import pytest
import ray
import ray.cloudpickle
import torch
import torch.distributed as dist

from rlcore.controller.decorator import Dispatch, register
from rlcore.controller.hosts import warm
from rlcore.controller.ray_group import RayWorkerGroup, ResourcePool
from rlcore.controller.worker import Worker
from rlcore.protocol import DataProto

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules by name


class ToyWorker(Worker):
    def __init__(self, scale: int, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        super().__init__(rank=rank, world_size=world_size, device=device)
        self.scale = scale

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale_rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data["x"] * self.scale, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sum_of_ranks(self) -> float:
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)  # proves the gloo group spans the actors
        return t.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank_1(self) -> float:
        """Rank 1 raises before the collective rank 0 then waits in for ever (a shape error in one rank's batch)."""
        if self.rank == 1:
            raise ValueError("rank 1's batch is bad")
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def backend_and_rank(self) -> tuple[str, int]:
        return dist.get_backend(), self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def torch_threads(self) -> int:
        return torch.get_num_threads()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environ(self, name: str) -> str | None:
        import os

        return os.environ.get(name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def new_group_timeout_s(self) -> float:
        """The timeout a process group created now gets (what FSDP2's and Ulysses' meshes get)."""
        from torch.distributed.distributed_c10d import Backend, _get_default_timeout

        return _get_default_timeout(Backend.GLOO).total_seconds()


def test_worker_group_dispatch_over_gloo(ray_cluster):
    pool = ResourcePool(nnodes=1, n_gpus_per_node=2, device="cpu")
    group = RayWorkerGroup(ToyWorker, pool, scale=10)
    try:
        out = group.scale_rows(DataProto.from_dict({"x": torch.arange(5)}))
        assert out["y"].tolist() == [0, 10, 20, 30, 40]
        assert out["rank"].tolist() == [0, 0, 0, 1, 1]
        assert group.sum_of_ranks() == [3.0, 3.0]
        assert group.backend_and_rank() == ("gloo", 0)
        assert group.drain_calls() == []  # not recording unless asked (rlcore.telemetry.perf asks)
        group.record_calls = True
        group.scale_rows(DataProto.from_dict({"x": torch.arange(5)}))
        (call,) = group.drain_calls()
        assert call.method == "scale_rows" and len(call.busy_s) == len(call.start_s) == 2 and group.drain_calls() == []
        # Each rank started after the send and finished before the results were back.
        assert all(0 <= start and start + busy <= call.span_s for start, busy in zip(call.start_s, call.busy_s))
        # A rank that raises is not waited behind (its peer blocks in a collective it never joins): its error comes
        # back as soon as it returns, not after trainer.hang_timeout_s (the group is left broken: the last check)
        start = time.monotonic()
        with pytest.raises(ValueError, match="rank 1's batch is bad"):
            group.fail_on_rank_1()
        assert time.monotonic() - start < 30 and group.stuck  # and the teardown below does not wait on rank 0
    finally:
        group.kill()
        pool.release()
    # The placement group's CPUs are returned once the pool is released (and the hosts kept warm are let go: the
    # shared cluster parks the pool for the next run, tests/controller/test_hosts.py).
    warm().close()
    ray.get(ray.remote(num_cpus=2)(lambda: True).remote(), timeout=60)


def test_two_groups_colocate_on_one_pool(ray_cluster):
    """A critic-like second group shares the devices: each rank takes half a bundle, each group its own gloo group.
    Each group's collectives time out after the group's collective_timeout_s (actor_rollout_ref.nccl_timeout), in
    every process group its ranks create, not only the world group (torch's default for new groups is 30 min)."""
    pool = ResourcePool(nnodes=1, n_gpus_per_node=2, device="cpu", max_colocate_count=2)
    first = RayWorkerGroup(ToyWorker, pool, scale=1, collective_timeout_s=45)
    second = RayWorkerGroup(ToyWorker, pool, scale=2)
    try:
        assert first.new_group_timeout_s() == [45.0, 45.0] and second.new_group_timeout_s() == [600.0, 600.0]
        assert pool.share() == {"CPU": 0.5}
        assert first.sum_of_ranks() == [3.0, 3.0] and second.sum_of_ranks() == [3.0, 3.0]
        assert second.scale_rows(DataProto.from_dict({"x": torch.arange(2)}))["y"].tolist() == [0, 2]
    finally:
        first.kill()
        second.kill()
        pool.release()


def test_placement_group_too_large_says_how_to_fix(ray_cluster):
    with pytest.raises(RuntimeError, match="n_gpus_per_node"):
        ResourcePool(nnodes=1, n_gpus_per_node=8, device="cpu", timeout_s=3).placement_groups()


@pytest.mark.parametrize("ranks, cpus_per_rank", [(1, 2), (2, 1)])
def test_a_cpu_rank_computes_with_the_cores_of_its_bundle(ray_cluster, ranks, cpus_per_rank):
    """One rank on the 2 CPUs runs 2 torch threads (Ray alone would pin it to 1); two ranks run 1 each."""
    pool = ResourcePool(nnodes=1, n_gpus_per_node=ranks, device="cpu", cpus_per_rank=cpus_per_rank)
    group = RayWorkerGroup(ToyWorker, pool, scale=1)
    try:
        assert group.torch_threads() == [cpus_per_rank] * ranks
    finally:
        group.kill()
        pool.release()


def test_ray_kwargs_timeline_json_file_gets_the_runs_tasks(ray_cluster, tmp_path):
    """What run_session writes at the end of a run with ray_kwargs.timeline_json_file: Ray's chrome trace."""
    import json

    from rlcore.controller.ray_session import write_timeline

    @ray.remote(num_cpus=0)
    def traced_step():
        return 1

    assert ray.get(traced_step.remote()) == 1
    path = tmp_path / "trace" / "timeline.json"
    write_timeline(str(path))
    events = json.loads(path.read_text())
    assert any("traced_step" in str(event.get("name", "")) for event in events)


def test_ray_kwargs_runtime_env_starts_every_worker_through_py_executable_with_env_vars(ray_cluster, tmp_path):
    """verl 0.9's launch scripts set ray_kwargs.ray_init.runtime_env.py_executable (a `uv run` command): each worker
    process starts through it, with runtime_env.env_vars set, on a cluster the run joined (the session's)."""
    import os
    import stat

    from rlcore.config import compose
    from rlcore.controller.ray_group import ray_runtime_env

    launcher = tmp_path / "launch_python"  # stands in for `uv run ...`: marks the process, then runs Python
    launcher.write_text(f"#!/bin/sh\nexport STARTED_BY_LAUNCHER=yes\nexec {sys.executable} \"$@\"\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    cfg = compose([f"ray_kwargs.ray_init.runtime_env.py_executable={launcher}",
                   "+ray_kwargs.ray_init.runtime_env.env_vars.RUN_FLAVOUR=v09"])
    runtime_env = ray_runtime_env(cfg.ray_kwargs.ray_init)
    assert runtime_env == {"py_executable": str(launcher), "env_vars": {"RUN_FLAVOUR": "v09"}}
    pool = ResourcePool(nnodes=1, n_gpus_per_node=1, device="cpu", cpus_per_rank=2)
    group = RayWorkerGroup(ToyWorker, pool, scale=1, runtime_env=runtime_env)
    try:
        assert group.environ("STARTED_BY_LAUNCHER") == ["yes"]
        assert group.environ("RUN_FLAVOUR") == ["v09"]
        assert group.environ("OMP_NUM_THREADS") == ["2"]  # rlcore's own per-rank variables stay
        assert os.environ.get("STARTED_BY_LAUNCHER") is None
    finally:
        group.kill()
        pool.release()
