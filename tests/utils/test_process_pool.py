"""The process pool under reward scoring and tools: a call's time limit starts once its process is set up."""

import time

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
