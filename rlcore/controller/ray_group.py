"""Worker groups on Ray: one actor per rank, placed in a ResourcePool's bundles, called through dispatch modes."""

from __future__ import annotations

import glob
import inspect
import os
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlcore.controller.decorator import DISPATCH_ATTR, MESH_ATTR, DataLayout, dispatch_and_collect
from rlcore.controller.hosts import Rank, host_class, host_options, warm
from rlcore.controller.placement import ResourcePool
from rlcore.controller.worker import node_ip


@dataclass
class GroupCall:
    """One group call: its round trip as the controller saw it (split, dispatch, every rank's work, transfer back,
    gather), each rank's seconds inside the method, and how long after the send each rank started it."""

    method: str
    span_s: float
    busy_s: list[float]
    start_s: list[float]


class RayWorkerGroup:
    """Creates `world_size` actors of `worker_cls`, wires their process group, and exposes registered methods.

    Colocated roles (actor + rollout + reference, verl's hybrid engine) live in ONE worker class, so they share
    the process and the device; a second role (e.g. a critic) is another group on the same pool (or its own).
    """

    def __init__(self, worker_cls: type, pool: ResourcePool, name: str = "worker", hang_timeout_s: float = 300.0,
                 collective_timeout_s: float = 600.0, nsight: dict | None = None, runtime_env: dict | None = None,
                 **init_kwargs: Any) -> None:
        self.pool = pool
        self.world_size = pool.world_size
        self.name = worker_cls.__name__ if name == "worker" else name
        self.hang_timeout_s, self.slowest = hang_timeout_s, {}
        self.stuck = False  # a rank raised while others stayed blocked in a collective: no graceful teardown for them
        # With record_calls (rlcore.telemetry.perf turns it on), every group call since the last drain_calls().
        self.record_calls, self.calls = False, []
        share = pool.share()
        # On CPU a rank computes with the cores of its bundle (Ray would otherwise pin it to one thread per
        # requested CPU, and a colocated group's fractional share to one); colocated groups alternate phases, so
        # each of their processes may use the whole bundle.
        env = {"OMP_NUM_THREADS": str(pool.cpus_per_rank), "TOKENIZERS_PARALLELISM": "false"} if pool.device == "cpu" else {}
        # The user's runtime environment (ray_kwargs.ray_init.runtime_env) on every actor, not only through ray.init:
        # a run that joins a cluster already initialized (a test session's, a notebook's) still gets it. Their
        # env_vars win over rlcore's per-rank defaults.
        user = dict(runtime_env or {})
        env = {**env, **user.pop("env_vars", {})}
        actor_env = {**user, **({"env_vars": env} if env else {}), **({"nsight": nsight} if nsight else {})} or None
        concurrency = getattr(worker_cls, "max_concurrency", 1)  # >1: calls run in threads of the actor
        options = host_options(worker_cls.__name__, share["CPU"], share.get("GPU", 0), concurrency, actor_env)
        self.workers = [Rank(self._host(worker_cls.__name__, rank, options, share, concurrency, actor_env), options)
                        for rank in range(self.world_size)]
        try:
            ray.get([w.actor.build.remote(worker_cls, rank=rank, world_size=self.world_size, device=pool.device, **init_kwargs)
                     for rank, w in enumerate(self.workers)])
        except BaseException:
            for w in self.workers:  # a role that failed to build leaves its host in no known state
                ray.kill(w.actor)
            raise
        self._layouts: dict[str | None, list[DataLayout]] = {None: [DataLayout(r, self.world_size) for r in range(self.world_size)]}
        master_addr, master_port = ray.get(self.workers[0].get_master_addr_port.remote())
        ray.get([w.init_process_group.remote(master_addr, master_port, collective_timeout_s) for w in self.workers])
        self.processes = ray.get([w.process_info.remote() for w in self.workers])
        self._bind_registered_methods(worker_cls)

    def _host(self, role: str, rank: int, options: tuple, share: dict, concurrency: int, runtime_env: dict | None):
        """An idle host of the pool started with `options` (its imports done), else a new one in rank's bundle."""
        actor = self.pool.take_host(rank, options)
        if warm() is not None:
            warm().count("reused" if actor is not None else "started")
        return actor or host_class(role).options(
            num_cpus=share["CPU"], num_gpus=share.get("GPU", 0), runtime_env=runtime_env, max_concurrency=concurrency,
            scheduling_strategy=PlacementGroupSchedulingStrategy(*self.pool.rank_bundle(rank))).remote()

    def _bind_registered_methods(self, worker_cls: type) -> None:
        for name, fn in inspect.getmembers(worker_cls, predicate=inspect.isfunction):
            mode = getattr(fn, DISPATCH_ATTR, None)
            if mode is not None:
                setattr(self, name, self._group_method(name, mode, getattr(fn, MESH_ATTR, None)))

    def layouts(self, mesh: str | None) -> list[DataLayout]:
        """Each rank's place in the data-parallel layout `mesh`, asked of the workers once (after init_model)."""
        if mesh not in self._layouts:
            self._layouts[mesh] = ray.get([w.data_layout.remote(mesh) for w in self.workers])
        return self._layouts[mesh]

    def rank0_address(self) -> tuple[str, int]:
        """Rank 0's node and a port free there: where a group of its own (beside the default one) meets."""
        return ray.get(self.workers[0].get_master_addr_port.remote())

    def dp_size(self, mesh: str | None = None) -> int:
        return self.layouts(mesh)[0].dp_size

    def _group_method(self, name: str, mode, mesh: str | None):
        ranks: list[tuple] = []  # (wall-clock start, seconds) of each rank in the last call

        def call(per_rank_args: list[tuple], per_rank_kwargs: list[dict]) -> list[Any]:
            refs = [w.timed_call.remote(name, *a, **k) for w, a, k in zip(self.workers, per_rank_args, per_rank_kwargs)]
            results = self.wait_all(name, refs)
            ranks[:] = [timing for _, *timing in results]
            return [result for result, *_ in results]

        def group_method(*args: Any, **kwargs: Any) -> Any:
            sent, start = time.time(), time.perf_counter()
            out = dispatch_and_collect(mode, self.layouts(mesh), call, args, kwargs)
            span = time.perf_counter() - start
            if not self.record_calls:
                return out
            # Another node's clock may be off by a little: a start before the send counts as no delay.
            self.calls.append(GroupCall(name, span, [b for _, b in ranks], [min(max(s - sent, 0.0), span) for s, _ in ranks]))
            return out

        group_method.__name__ = name
        return group_method

    def drain_calls(self) -> list[GroupCall]:
        calls, self.calls = self.calls, []
        return calls

    def hang_bound(self, method: str) -> float:
        """Seconds a call may take before the group counts as hung: trainer.hang_timeout_s + twice the slowest
        call of this method so far (3 x hang_timeout_s for its first call: model loading, first compilations)."""
        slowest = self.slowest.get(method)
        return 3 * self.hang_timeout_s if slowest is None else self.hang_timeout_s + 2 * slowest

    def wait_all(self, method: str, refs: list) -> list[Any]:
        """Every rank's result; a rank that died raises RayActorError (the restart path), ranks that stop
        answering raise WorkerHang naming them, after `hang_bound(method)` seconds. A rank that raises is not waited
        behind: its peers may be blocked in a collective it never joined, so its error is raised as soon as it
        returns (after ERROR_GRACE_S for the other ranks' errors), not after the hang bound."""
        start, bound = time.monotonic(), self.hang_bound(method)
        pending, outcomes = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, start + bound - time.monotonic()))
            if not ready:
                raise WorkerHang(self.describe_hang(method, [refs.index(ref) for ref in pending], bound))
            outcomes[ready[0]] = _outcome(ready[0])
            if isinstance(outcomes[ready[0]], _Raised):
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=ERROR_GRACE_S) if pending else ([], [])
                outcomes.update((ref, _outcome(ref)) for ref in ready)
                self.stuck = bool(pending)
                break
        errors = [outcome.error for outcome in outcomes.values() if isinstance(outcome, _Raised)]
        # A dead rank fails its peers' collectives too: its RayActorError (what the restart path handles) is the
        # cause, whichever rank's error comes first.
        if errors:
            raise next((e for e in errors if isinstance(e, ray.exceptions.RayActorError)), errors[0])
        self.slowest[method] = max(self.slowest.get(method, 0.0), time.monotonic() - start)
        return [outcomes[ref] for ref in refs]

    def describe_hang(self, method: str, ranks: list[int], bound: float) -> str:
        """Which ranks did not answer and what their processes are doing (when they run on this machine)."""
        here, logs = node_ip(), _session_logs_dir()
        lines = [f"{self.name}.{method}: {len(ranks)} of {self.world_size} ranks did not answer within {bound:.0f} s "
                 f"(trainer.hang_timeout_s={self.hang_timeout_s:g} + 2 x the slowest earlier call)"]
        for rank in ranks:
            ip, pid, _ = self.processes[rank]
            state = "on another node"
            if ip == here:
                state = _process_state(pid)
            log = next(iter(sorted(glob.glob(os.path.join(logs, f"worker-*-{pid}.err")))), None) if logs else None
            lines.append(f"  rank {rank}: pid {pid} on {ip}, {state}" + (f"; log {log}" if log else ""))
        lines.append("A stopped or stuck rank leaves the others waiting in a collective with it.")
        return "\n".join(lines)

    def kill(self, graceful: bool = True) -> None:
        """Tears the group down: each rank leaves its process group (if graceful) and its host is parked for the
        next group on the pool where it is clean and hosts are kept warm (rlcore.controller.hosts), else killed.
        The pool's placement group stays (another group may share it): `pool.release()` frees it."""
        left = None
        if graceful and not self.stuck:  # a rank blocked in a collective would not answer the shutdown call
            try:
                left = ray.get([w.actor.retire.remote() for w in self.workers], timeout=30)
            except Exception:
                pass  # a dead actor cannot tear down its process group; killing it is what matters
        for rank, w in enumerate(self.workers):
            clean = left is not None and not left[rank]
            if warm() is not None and left is not None:
                warm().count("parked" if clean else "dirty", left[rank])
            if not (clean and self.pool.park_host(rank, w.options, w.actor)):
                ray.kill(w.actor)


class WorkerHang(RuntimeError):
    """Ranks of a worker group stopped answering (stopped, deadlocked, or waiting on one that is)."""


# Seconds the other ranks get, once one rank has raised, to return their own errors (a dead rank's RayActorError
# is what the restart path needs); ranks still blocked in a collective the raising rank never joined do not return.
ERROR_GRACE_S = 2.0


@dataclass
class _Raised:
    error: Exception


def _outcome(ref) -> Any:
    """A finished call's result, or its exception wrapped (a result may itself be any object)."""
    try:
        return ray.get(ref)
    except Exception as err:  # noqa: BLE001 -- the caller sorts the errors
        return _Raised(err)


def _session_logs_dir() -> str | None:
    node = getattr(ray._private.worker, "_global_node", None)
    return node.get_logs_dir_path() if node is not None else None


def _process_state(pid: int) -> str:
    try:
        import psutil

        status = psutil.Process(pid).status()
    except Exception:  # noqa: BLE001 -- gone, or psutil cannot see it
        return "no longer running"
    if status == "stopped":
        return "STOPPED (SIGSTOP or a debugger): this is the rank holding the others"
    return f"{status} (waiting in a collective, or stuck in its own code)"


def init_ray(address: str | None, num_cpus: int | None, runtime_env: dict | None = None) -> bool:
    """Joins `address` (config) or RAY_ADDRESS if given, else starts a local cluster, with the job's `runtime_env`
    (ray_kwargs.ray_init.runtime_env). Returns True if we started it."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    env = {"runtime_env": runtime_env} if runtime_env else {}
    if address:
        ray.init(address=address, log_to_driver=True, **env)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, configure_logging=False, **env)
    return True


def ray_runtime_env(ray_init) -> dict:
    """Ray's runtime_env dict from `ray_kwargs.ray_init` (typed or a DictConfig): only what the user set."""
    section = ray_init.runtime_env
    env = {"py_executable": section.py_executable} if section.py_executable else {}
    return {**env, **({"env_vars": dict(section.env_vars)} if section.env_vars else {})}
