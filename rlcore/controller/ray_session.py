"""The local Ray cluster a run starts, and nothing of it left behind however the run ends.

- A clean end, an exception, Ctrl-C or SIGTERM: `ray_cluster` shuts the cluster down (SIGTERM becomes SystemExit
  so the cleanup runs), then stops any process of its session that outlived `ray.shutdown()`. While a trainer's
  loop runs, the first SIGTERM is deferred to the end of the step in flight instead (rlcore.trainer.preemption).
- SIGKILL of the driver runs no cleanup; Ray's own fate-sharing takes the session's processes (GCS, raylet,
  dashboard and runtime-env agents, workers) down with it: measured gone 0.2 s after the kill with Ray 2.x here,
  and tests/reliability/test_ray_session.py asserts it within 30 s.
A cluster joined through trainer/RAY_ADDRESS is never touched.

While a cluster rlcore started lasts, the worker hosts of torn-down groups are kept warm for the next run on it
(rlcore.controller.hosts): a test session's runs, a sweep's jobs.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import threading

import psutil
import ray

from rlcore.controller.hosts import end_warm, keep_warm
from rlcore.controller.ray_group import init_ray

GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long


def session_processes(session_dir: str) -> list[psutil.Process]:
    """The processes of a Ray session: those naming its directory on their command line, and their descendants."""
    name = os.path.basename(session_dir.rstrip("/"))
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(name in arg for arg in proc.info["cmdline"] or ()):
                found[proc.pid] = proc
                found.update({child.pid: child for child in proc.children(recursive=True)})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def stop_processes(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=GRACE_S)


def _session_dir() -> str | None:
    node = getattr(ray._private.worker, "_global_node", None)
    return node.get_session_dir_path() if node is not None else None


def write_timeline(path: str) -> None:
    """ray_kwargs.timeline_json_file: Ray's timeline of the run's tasks and actor calls (chrome://tracing or
    Perfetto), written before the cluster goes; the cluster's whole history when the run joined a running one."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ray.timeline(filename=path)
    print(f"Ray timeline written to {path}", flush=True)


def _exit_on_sigterm(previous, signum, frame):
    """SIGTERM stops the run, through the cleanup. A handler the process had before the run (a test session's,
    which ends the session) hears of it first: the run is one part of what is being stopped."""
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signum, frame)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def ray_cluster(address: str | None, num_cpus: int | None, runtime_env: dict | None = None):
    """Joins `address` / RAY_ADDRESS, or starts a local cluster that is gone when the block exits (see module doc),
    or, between `keep_local_cluster()` and `end_kept_cluster()` (a sweep's jobs), joins the one kept for them.
    Yields whether this run started the cluster."""
    if _KEPT.active and not (address or os.environ.get("RAY_ADDRESS")):
        _kept(num_cpus, runtime_env)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    started, session_dir = False, None
    try:
        started = init_ray(address, num_cpus, runtime_env)
        session_dir = _session_dir() if started else None
        if started:
            keep_warm()
        if in_main:  # after ray.init, which installs a handler of its own
            signal.signal(signal.SIGTERM, functools.partial(_exit_on_sigterm, previous))
        yield started
    finally:
        if started:
            end_warm()
            ray.shutdown()
        if session_dir:
            stop_processes(session_processes(session_dir))  # what outlived ray.shutdown() (agents, stuck workers)
        if in_main:
            signal.signal(signal.SIGTERM, previous)


# A sweep's jobs share one local cluster, and the worker hosts it keeps warm (rlcore.controller.hosts), instead of
# each starting and stopping its own: its start is ~6 s and its workers' imports ~5 s per group on a 2-core CPU.
# The cluster starts with the first job that needs it and again when a job asks for other ray_init settings.
class _Kept:
    active = False
    stack: contextlib.ExitStack | None = None
    key: tuple | None = None


_KEPT = _Kept()


def keep_local_cluster() -> None:
    """From now, runs without a cluster address share one local cluster (rlcore.cli.sweep, at a sweep's start)."""
    end_kept_cluster()
    _KEPT.active = True
    atexit.register(end_kept_cluster)


def end_kept_cluster() -> None:
    """Shuts the kept cluster down (at the sweep's end, or its process's)."""
    stack, _KEPT.active, _KEPT.stack, _KEPT.key = _KEPT.stack, False, None, None
    if stack is not None:
        stack.close()


def _kept(num_cpus: int | None, runtime_env: dict | None) -> None:
    key = (num_cpus, json.dumps(runtime_env or {}, sort_keys=True))
    if _KEPT.stack is not None and _KEPT.key == key and ray.is_initialized():
        return
    if _KEPT.stack is not None:
        _KEPT.stack.close()
    stack, _KEPT.active = contextlib.ExitStack(), False  # (the cluster below is a plain one)
    try:
        stack.enter_context(ray_cluster(None, num_cpus, runtime_env))
    finally:
        _KEPT.active = True
    _KEPT.stack, _KEPT.key = stack, key
