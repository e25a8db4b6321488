"""Nothing left behind: after SIGTERM or SIGKILL of a driver, no process of its Ray session survives 30 s."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlcore.controller import ray_session

REPO = Path(__file__).resolve().parents[2]
DRIVER = """
import signal, sys, time, ray
from rlcore.controller.ray_session import ray_cluster
# the process's own handler from before the run (a test session's ends the session): it hears of the signal first
signal.signal(signal.SIGTERM, lambda signum, frame: print("outer handler heard", signum, flush=True))
with ray_cluster(None, 1):
    print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
    time.sleep(600)
"""


def start_driver():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    session_dir = proc.stdout.readline().strip()
    assert session_dir and ray_session.session_processes(session_dir), "the driver started no Ray session"
    return proc, session_dir


def gone_within(session_dir, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not ray_session.session_processes(session_dir):
            return True
        time.sleep(0.5)
    return False


def test_sigterm_of_the_driver_shuts_its_session_down():
    proc, session_dir = start_driver()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM  # SystemExit through the cleanup, not a bare kill
    assert proc.stdout.read().strip() == f"outer handler heard {int(signal.SIGTERM)}"
    assert gone_within(session_dir)


def test_after_sigkill_of_the_driver_its_session_is_gone():
    proc, session_dir = start_driver()
    proc.kill()
    proc.wait(timeout=30)
    assert gone_within(session_dir)  # Ray's fate-sharing: measured 0.2 s


def test_stop_processes_terminates_then_kills():
    ignoring = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                                 "time.sleep(600)", "--session-dir=/tmp/ray/session_test_stop"], stdout=subprocess.PIPE, text=True)
    ignoring.stdout.readline()  # its SIGTERM handler is in place
    procs = ray_session.session_processes("/tmp/ray/session_test_stop")
    assert [p.pid for p in procs] == [ignoring.pid]
    start = time.monotonic()
    ray_session.stop_processes(procs)
    assert not ray_session.session_processes("/tmp/ray/session_test_stop") and time.monotonic() - start < ray_session.GRACE_S + 2
