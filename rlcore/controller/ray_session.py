"""The local Ray cluster a run starts, and nothing of it left behind however the run ends.

- A clean end, an exception, Ctrl-C or SIGTERM: `ray_cluster` shuts the cluster down (SIGTERM becomes SystemExit
  so the cleanup runs), then stops any process of its session that outlived `ray.shutdown()`.
- SIGKILL of the driver runs no cleanup, so every local session is recorded (driver pid + session directory) in
  REGISTRY; the next `ray_cluster` on the machine stops the processes of sessions whose driver is gone (raylet,
  GCS, dashboard and runtime-env agents, and their workers) before it starts its own.
A cluster joined through trainer/RAY_ADDRESS is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading

import psutil
import ray

from rlcore.controller.ray_group import init_ray

REGISTRY = os.environ.get("RLCORE_RAY_SESSIONS", os.path.join(tempfile.gettempdir(), "rlcore_ray_sessions"))
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


def _record_path(pid: int) -> str:
    return os.path.join(REGISTRY, f"{pid}.json")


def record_session() -> str | None:
    """Notes this driver's local session (for `reap_orphaned_sessions`); returns its directory."""
    node = getattr(getattr(ray, "_private").worker, "_global_node", None)
    session_dir = node.get_session_dir_path() if node is not None else None
    if session_dir:
        os.makedirs(REGISTRY, exist_ok=True)
        me = psutil.Process()
        with open(_record_path(me.pid), "w") as f:
            json.dump({"driver": me.pid, "driver_started": me.create_time(), "session_dir": session_dir}, f)
    return session_dir


def _driver_alive(record: dict) -> bool:
    try:
        return abs(psutil.Process(record["driver"]).create_time() - record["driver_started"]) < 1.0  # not a reused pid
    except psutil.NoSuchProcess:
        return False


def reap_orphaned_sessions() -> list[str]:
    """Stops the processes of recorded sessions whose driver died without cleaning up; one line per session."""
    if not os.path.isdir(REGISTRY):
        return []
    reaped = []
    for name in sorted(os.listdir(REGISTRY)):
        path = os.path.join(REGISTRY, name)
        try:
            record = json.load(open(path))
        except (OSError, ValueError):
            continue
        if _driver_alive(record):
            continue
        procs = session_processes(record["session_dir"])
        stop_processes(procs)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        if procs:
            reaped.append(f"stopped {len(procs)} processes of Ray session {record['session_dir']} left by driver pid "
                          f"{record['driver']}, which exited without shutting it down")
    return reaped


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def ray_cluster(address: str | None, num_cpus: int | None):
    """Joins `address` / RAY_ADDRESS, or starts a local cluster that is gone when the block exits (see module doc).
    Yields whether this run started the cluster."""
    for line in reap_orphaned_sessions():
        print(f"rlcore: {line}", flush=True)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    started, session_dir = False, None
    try:
        started = init_ray(address, num_cpus)
        session_dir = record_session() if started else None
        if in_main:  # after ray.init, which installs a handler of its own
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        yield started
    finally:
        if started:
            ray.shutdown()
        if session_dir:
            stop_processes(session_processes(session_dir))  # what outlived ray.shutdown() (agents, stuck workers)
            with contextlib.suppress(FileNotFoundError):
                os.remove(_record_path(os.getpid()))
        if in_main:
            signal.signal(signal.SIGTERM, previous)
