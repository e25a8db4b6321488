"""Worker hosts kept warm on the cluster rlcore started: a torn-down group's clean processes (imports done) serve the
next group on the same placement; a host its role left dirty, or one of a group that failed, is killed instead."""

import os
import sys
import threading

import ray
import ray.cloudpickle

from rlcore.controller.decorator import Dispatch, register
from rlcore.controller.hosts import warm
from rlcore.controller.ray_group import RayWorkerGroup, ResourcePool
from rlcore.controller.worker import Worker

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules by name


class Role(Worker):
    def __init__(self, tag: str, leave_thread: bool = False, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        super().__init__(rank=rank, world_size=world_size, device=device)
        self.tag = tag
        if leave_thread:  # a role whose server thread outlives it (an endpoint it never closes)
            self.stop = threading.Event()
            threading.Thread(target=self.stop.wait, name="role-server", daemon=True).start()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def seen(self) -> tuple:
        """This rank's pid, its role's tag, whether an earlier role's module state is still imported, its threads."""
        import torch

        return os.getpid(), self.tag, "rlcore.protocol" in sys.modules, torch.get_num_threads()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_threads(self, n: int) -> None:
        import torch

        torch.set_num_threads(n)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def world(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()


def group(tag: str, **kwargs) -> tuple[RayWorkerGroup, ResourcePool]:
    pool = ResourcePool(nnodes=1, n_gpus_per_node=2, device="cpu")
    return RayWorkerGroup(Role, pool, tag=tag, **kwargs), pool


def end(g: RayWorkerGroup, pool: ResourcePool, graceful: bool = True) -> None:
    g.kill(graceful=graceful)
    pool.release()


def test_clean_hosts_serve_the_next_group_and_dirty_or_failed_ones_are_killed(ray_cluster):
    # One sequence of groups on the same placement (each host start is seconds): a clean group's hosts come back to
    # the next, whose role leaves a thread behind; those are killed, as are the hosts of a group torn down after a
    # failure; every start after a kill is a new process.
    warm().close()
    first, pool = group("first")
    pids = [pid for pid, *_ in first.seen()]
    first.set_threads(2)  # a role that changes its process's torch threads does not pass it on
    end(first, pool)
    before = dict(warm().counts)
    dirty, pool = group("dirty", leave_thread=True)
    assert dirty.seen() == [(pid, "dirty", True, 1) for pid in pids]  # same processes, a new role, imports kept
    assert dirty.world() == [2.0, 2.0]  # a new process group over the reused hosts
    assert warm().counts["reused"] - before.get("reused", 0) == 2
    end(dirty, pool)
    assert warm().counts["not parked: thread role-server"] - before.get("not parked: thread role-server", 0) == 2
    after, pool = group("after")
    failed_pids = {pid for pid, *_ in after.seen()}
    assert not failed_pids & set(pids)
    end(after, pool, graceful=False)  # (a crash: the ranks may be stuck in a collective)
    fresh, pool = group("fresh")
    try:
        assert not {pid for pid, *_ in fresh.seen()} & (set(pids) | failed_pids)
    finally:
        end(fresh, pool)
