"""Process helpers for test modules whose own functions run in spawned processes (a process pool's target): a
spawned child imports the module its target lives in, so what that module imports at the top is paid again by every
child. This one imports only psutil."""

from __future__ import annotations

import psutil

KEPT: set[int] = set()  # the warm rank processes the pytest run keeps (tests/rank_pool.py)


def spawned_children() -> list:
    """This process's live descendants that multiprocessing spawned (pool processes, ranks), not its other children:
    multiprocessing's resource tracker lives as long as the interpreter, the tests' shared Ray cluster (gcs_server,
    raylet, its workers) and its warm rank processes (tests/rank_pool.py) as long as the pytest run."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in KEPT and proc.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found
