"""The process pool under reward scoring and tools: a call's time limit starts once its process is set up; a call
that waits is parked, so hung calls time out side by side on a bounded number of processes; a key's requests stay
in its process while it lives."""

import os
import threading
import time

from proc_utils import spawned_children

from rlcore.utils.process_pool import ProcessPool, call_catching, serve


def slow_to_start(conn, setup_s: float) -> None:
    """A process whose set-up (imports, building tools) takes `setup_s`, then echoes or sleeps on request."""
    time.sleep(setup_s)
    serve(conn, lambda request: call_catching(time.sleep, request) if isinstance(request, float) else (True, request))


def test_set_up_time_does_not_count_against_a_calls_timeout():
    pool = ProcessPool(slow_to_start, (2.0,), num_workers=1, timeout_s=1.0)
    try:
        began = time.monotonic()
        assert [(o.status, o.value) for o in pool.run(["a", "b"])] == [("ok", "a"), ("ok", "b")]  # 2 s set-up, 1 s limit
        assert time.monotonic() - began >= 2.0
        began = time.monotonic()
        outcome, = pool.run([30.0])  # a hung call still times out, one limit after it started
        assert outcome.status == "timeout" and 1.0 <= time.monotonic() - began < 2.5
        assert [o.status for o in pool.run(["c"])] == ["ok"]  # the replacement process sets up again, then serves
    finally:
        pool.close()


def sleep_or_echo(conn) -> None:
    """Sleeps `request` seconds when it is a float (3600: a hung call), else echoes it; answers with its process id."""
    serve(conn, lambda request: (True, (time.sleep(request) if isinstance(request, float) else request, os.getpid())))



def test_a_call_past_suspect_time_is_parked_and_its_result_still_counts():
    pool = ProcessPool(sleep_or_echo, (), num_workers=1, timeout_s=3.0, suspect_s=0.2)
    try:
        pool.run(["warm"])  # the process is set up
        outcomes = pool.run([1.5, "a", "b"])  # one process: "a" and "b" would wait 1.5 s behind the slow call
        assert [(o.status, o.value[0]) for o in outcomes] == [("ok", None), ("ok", "a"), ("ok", "b")]
        slow_pid = outcomes[0].value[1]
        assert outcomes[1].value[1] != slow_pid  # a fresh process took the next calls while the slow one ran
        assert [p.process.pid for p in pool.procs] == [slow_pid] and len(spawned_children()) == 1  # back to one process
    finally:
        pool.close()
    assert spawned_children() == []


def test_hung_calls_wait_out_their_timeouts_side_by_side_on_a_bounded_number_of_processes():
    # 40 hung calls, 2 workers, 2 s each, 4 failures tolerated: the 5th timeout ends the run. Without parking that is
    # ceil(5 / 2) = 3 rounds (6 s); parked, the calls time out side by side on at most 2 + 4 + 1 = 7 processes, in one
    # timeout plus parking (0.5 s) plus the fresh processes' set-up (up to ~2 s on a loaded CI machine).
    pool = ProcessPool(sleep_or_echo, (), num_workers=2, timeout_s=2.0)
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], len(pool.procs))

    try:
        pool.run(["warm", "warm"])
        watcher = threading.Thread(target=watch)
        watcher.start()
        start = time.monotonic()
        outcomes = pool.run([3600.0] * 40, max_failures=4)
        took = time.monotonic() - start
        done.set()
        watcher.join()
        print(f"5 timeouts of 2 s, 2 workers: the run stopped after {took:.2f} s on at most {peak[0]} processes (in rounds: 6 s)")
        assert [o.status for o in outcomes if o is not None] == ["timeout"] * 5 and outcomes.count(None) == 35
        assert 2.0 <= took < 5.0 and 4 <= peak[0] <= 7
        assert len(pool.procs) == 2 and len(spawned_children()) == 2  # the killed ones are gone, two fresh ones set up
        assert [o.status for o in pool.run(["x", "y"])] == ["ok", "ok"]
    finally:
        pool.close()
    assert spawned_children() == []


def test_a_keys_requests_stay_in_its_process_while_it_lives_and_move_once_it_is_killed():
    pool = ProcessPool(sleep_or_echo, (), num_workers=2, timeout_s=1.0, suspect_s=0.1)
    try:
        first = pool.run(["a", "b"], keys=["A", "B"])
        home = {key: o.value[1] for key, o in zip("AB", first)}
        # A's slow call is parked; A's next call waits for it in A's process, B's and C's go on elsewhere
        outcomes = pool.run([0.6, "a2", "b2", "c"], keys=["A", "A", "B", "C"])
        assert [o.value[1] for o in outcomes[:3]] == [home["A"], home["A"], home["B"]] and outcomes[3].value[1] != home["A"]
        outcomes = pool.run([3600.0, "a3"], keys=["A", "A"])  # A's process is killed: its key's next call moves
        assert [o.status for o in outcomes] == ["timeout", "ok"] and outcomes[1].value[1] != home["A"]
        assert set(pool.held_keys()) == {"A", "B", "C"}
        pool.forget_keys()
        assert pool.held_keys() == [] and len(pool.procs) == 2
    finally:
        pool.close()
    assert spawned_children() == []
