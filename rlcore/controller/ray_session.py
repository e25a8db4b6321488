"""The local Ray cluster a run starts, and nothing of it left behind however the run ends.

- A clean end, an exception, Ctrl-C or SIGTERM: `ray_cluster` shuts the cluster down (SIGTERM becomes SystemExit
  so the cleanup runs), then stops any process of its session that outlived `ray.shutdown()`.
- SIGKILL of the driver runs no cleanup; Ray's own fate-sharing takes the session's processes (GCS, raylet,
  dashboard and runtime-env agents, workers) down with it: measured gone 0.2 s after the kill with Ray 2.x here,
  and tests/reliability/test_ray_session.py asserts it within 30 s.
A cluster joined through trainer/RAY_ADDRESS is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import psutil
import ray

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


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def ray_cluster(address: str | None, num_cpus: int | None):
    """Joins `address` / RAY_ADDRESS, or starts a local cluster that is gone when the block exits (see module doc).
    Yields whether this run started the cluster."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    started, session_dir = False, None
    try:
        started = init_ray(address, num_cpus)
        session_dir = _session_dir() if started else None
        if in_main:  # after ray.init, which installs a handler of its own
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        yield started
    finally:
        if started:
            ray.shutdown()
        if session_dir:
            stop_processes(session_processes(session_dir))  # what outlived ray.shutdown() (agents, stuck workers)
        if in_main:
            signal.signal(signal.SIGTERM, previous)
