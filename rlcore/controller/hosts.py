"""Worker hosts: the processes a worker group's ranks run in, kept warm between the runs of one cluster.

A rank of a worker group is a `WorkerHost` actor that builds the role it is given (a `Worker` subclass) and runs
its methods; its actor class is named after the role, so `ps` and Ray's dashboard still say which role a process
serves. Starting one costs a process and the imports of torch, transformers and rlcore (~5 s of a 2-core CPU, before
any work). Where the cluster outlives the run -- the cluster rlcore itself started, while its `ray_cluster` block
lasts: a test session, a Hydra sweep's jobs -- a torn-down rank's host is parked with the placement group it sits in,
and the next worker group that asks for the same place with the same process settings (role, environment, CPU/GPU
share, concurrency) gets it back, imports done.

A host is parked only if its role left it as a fresh one would be: no process group, no thread the role started
still running, megatron-core's parallel state reset, and no vLLM engine ever built in it (vLLM's globals live as long
as the process). Otherwise, and for the hosts of a group torn down after a failure, it is killed. A cluster joined
through an address never keeps hosts: parked hosts hold their placement group's devices, which another job on that
cluster may need.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group


class WorkerHost:
    """One rank's process: `build` makes the role, `call` runs its methods, `retire` ends it and says whether the
    process is as clean as a fresh one (and may be given another role)."""

    def __init__(self) -> None:
        import torch

        self.role = None
        self.threads = torch.get_num_threads()
        self.baseline = {t.ident for t in threading.enumerate()}

    def build(self, worker_cls: type, **kwargs: Any) -> None:
        self.role = worker_cls(**kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.role, method)(*args, **kwargs)

    def retire(self) -> list[str]:
        """Ends the role (its `shutdown`: every rank calls this at once, it leaves the process group) and returns
        what would keep this process from hosting another one (nothing: it may be parked)."""
        import torch
        import torch.distributed as dist

        role, self.role = self.role, None
        if role is not None:
            role.shutdown()
        del role
        gc.collect()
        torch.set_num_threads(self.threads)
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        left = ["a process group"] if dist.is_initialized() else []
        mpu = sys.modules.get("megatron.core.parallel_state")
        if mpu is not None and mpu.model_parallel_is_initialized() and not left:
            # Its groups went with the process group; its globals still name them. The next role initialises its own.
            mpu.destroy_model_parallel()
        if mpu is not None and mpu.model_parallel_is_initialized():
            left.append("megatron-core's parallel state")
        if "vllm" in sys.modules:  # its distributed and compilation state outlive an engine: one engine per process
            left.append("vLLM's process state")
        # (threads of C++ code that called into Python, seen as _DummyThread, belong to the libraries: Ray's, gloo's;
        # so does tqdm's monitor, one per process)
        threads = [t.name for t in threading.enumerate() if t.ident not in self.baseline and t.is_alive()
                   and not isinstance(t, threading._DummyThread) and t.name != "tqdm_monitor"]
        return left + [f"thread {name}" for name in threads]


@functools.cache
def host_class(role: str):
    """The host actor class for a role, named after it: its processes are titled ray::<role> (ps, top, Ray's
    dashboard), and a parked host serves the same role again."""
    return ray.remote(type(role, (WorkerHost,), {"__doc__": WorkerHost.__doc__}))


class _Method:
    def __init__(self, actor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any):
        return self.actor.call.remote(self.name, *args, **kwargs)


class Rank:
    """A rank as the controller calls it, `rank.method.remote(...)`, whatever host process it runs in."""

    def __init__(self, actor, options: tuple) -> None:
        self.actor, self.options = actor, options

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self.actor, name)


def host_options(role: str, cpus: float, gpus: float, concurrency: int, runtime_env: dict | None) -> tuple:
    """What a host process is started with, as a key: only a host started the same way may be given back."""
    return role, cpus, gpus, concurrency, json.dumps(runtime_env or {}, sort_keys=True)


@dataclass
class Parked:
    """A released pool's placement groups and the idle hosts in them, by (rank, host options)."""

    key: tuple
    pgs: list
    hosts: dict[tuple[int, tuple], list] = field(default_factory=dict)


class WarmHosts:
    """The parked pools of the cluster rlcore started, while it lasts (`warm()` is the one, or None)."""

    def __init__(self) -> None:
        self.parked: list[Parked] = []
        self.counts: Counter = Counter()  # hosts started, reused, parked, and why others were not (the suite's account)

    def count(self, what: str, reasons: list[str] = ()) -> None:
        self.counts[what] += 1
        self.counts.update(f"not parked: {reason}" for reason in reasons)

    def take(self, key: tuple) -> Parked | None:
        """A parked pool of placement `key`; on a miss every parked pool is freed, so a new one has room."""
        for i, parked in enumerate(self.parked):
            if parked.key == key:
                return self.parked.pop(i)
        self.close()
        return None

    def park(self, parked: Parked) -> None:
        self.parked.append(parked)

    def close(self) -> None:
        parked, self.parked = self.parked, []
        for pool in parked:
            kill_all(pool)

    def idle(self) -> tuple[set, set]:
        """(actor ids, placement group ids) held parked: what a check for leftovers of a run may find."""
        actors = {actor._actor_id.hex() for pool in self.parked for hosts in pool.hosts.values() for actor in hosts}
        return actors, {pg.id.hex() for pool in self.parked for pg in pool.pgs}


def kill_all(parked: Parked) -> None:
    for hosts in parked.hosts.values():
        for actor in hosts:
            ray.kill(actor)
    for pg in parked.pgs:
        remove_placement_group(pg)


_WARM: list[WarmHosts] = []
TOTALS: Counter = Counter()  # every ended warm session's counts (the test suite prints them)


def warm() -> WarmHosts | None:
    return _WARM[-1] if _WARM else None


def keep_warm() -> WarmHosts:
    """From now until `end_warm()`, released pools are parked (rlcore.controller.ray_session, on a cluster it started)."""
    _WARM.append(WarmHosts())
    return _WARM[-1]


def end_warm() -> None:
    if _WARM:
        ended = _WARM.pop()
        ended.close()
        TOTALS.update(ended.counts)
