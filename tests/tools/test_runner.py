"""The tool runner: calls run in worker processes, in parallel across them, with instance state kept per trajectory;
a tool that raises, hangs or kills its process costs its call an error text for the model, within the time limit,
and the next call is served."""

import time

import pytest

from rlcore.config.tool_config import ToolSpec
from rlcore.tools.builtin import AddTool
from rlcore.tools.runner import ToolCall, ToolResult, ToolRunner
from rlcore.tools.testing import schema

TIMEOUT_S = 1.0
SLACK_S = 1.5  # killing and respawning a process on a shared 2-core machine


def specs(log: str = "") -> list[ToolSpec]:
    testing = "rlcore.tools.testing."
    return [ToolSpec("rlcore.tools.builtin.AddTool", {}, AddTool.TOOL_SCHEMA),
            ToolSpec(testing + "RaisingTool", {}, schema("raise")),
            ToolSpec(testing + "SleepingTool", {}, schema("sleep", ("seconds",))),
            ToolSpec(testing + "ExitingTool", {}, schema("exit")),
            ToolSpec(testing + "CounterTool", {"log": log}, schema("count"))]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    log = tmp_path_factory.mktemp("tools") / "released.txt"
    with ToolRunner(specs(str(log)), num_workers=2, timeout_s=TIMEOUT_S) as runner:
        runner.log = log
        runner.start([{}] * 4)
        runner.execute([ToolCall(0, "add", {"a": 0, "b": 0}), ToolCall(1, "add", {"a": 0, "b": 0})])  # both processes up
        yield runner
    assert all(not p.process.is_alive() for p in runner.pool.procs)


def test_results_in_call_order_with_errors_as_text(runner):
    results = runner.execute([ToolCall(1, "add", {"a": 2, "b": 3}), ToolCall(0, "raise", {"x": 1}), ToolCall(0, None, None, "error: bad JSON"),
                              ToolCall(2, "mul", {}), ToolCall(3, "sleep", {}), ToolCall(0, "add", {"a": 1, "b": "x"})])
    assert results == [
        ToolResult("5", None, {}, "ok"),
        ToolResult("error: ValueError: bad input {'x': 1}", None, {}, "error"),
        ToolResult("error: bad JSON", None, {}, "error"),
        ToolResult("error: there is no tool 'mul'; available tools: add, raise, sleep, exit, count", None, {}, "error"),
        ToolResult("error: tool sleep needs the argument(s) seconds", None, {}, "error"),
        ToolResult("error: ValueError: add takes integers a and b, got b='x' (str)", None, {}, "error")]


def test_a_hung_tool_times_out_and_its_replacement_serves_the_next_call(runner):
    [before] = runner.execute([ToolCall(0, "sleep", {"seconds": 0})])
    start = time.monotonic()
    results = runner.execute([ToolCall(0, "sleep", {"seconds": 1000}), ToolCall(1, "add", {"a": 1, "b": 1})])
    took = time.monotonic() - start
    assert results == [ToolResult("error: tool sleep timed out after 1s", None, {}, "timeout"), ToolResult("2", None, {}, "ok")]
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S
    [after] = runner.execute([ToolCall(0, "sleep", {"seconds": 0})])  # trajectory 0 lost its process
    assert after.status == "ok" and after.text != before.text  # another process id


def test_a_tool_that_kills_its_process_is_an_error_and_the_process_is_replaced(runner):
    assert runner.execute([ToolCall(1, "exit", {})]) == [ToolResult("error: tool exit crashed its process", None, {}, "error")]
    assert runner.execute([ToolCall(1, "add", {"a": 1, "b": 2}), ToolCall(3, "add", {"a": 2, "b": 2})]) == [
        ToolResult("3", None, {}, "ok"), ToolResult("4", None, {}, "ok")]


def test_calls_in_different_processes_run_side_by_side(runner):
    start = time.monotonic()
    results = runner.execute([ToolCall(0, "sleep", {"seconds": 0.6}), ToolCall(1, "sleep", {"seconds": 0.6})])
    took = time.monotonic() - start
    assert [r.status for r in results] == ["ok", "ok"] and results[0].text != results[1].text
    assert took < 1.0, f"two 0.6 s calls on 2 processes took {took:.2f} s"


def test_instances_keep_state_per_trajectory_until_finish(runner):
    runner.start([{"count": {"create_kwargs": {"start": 10}, "execute_kwargs": {"step": 2}, "release_kwargs": {"suffix": "!"}}}, {}])
    results = runner.execute([ToolCall(0, "count", {}), ToolCall(1, "count", {}), ToolCall(0, "count", {})])
    assert [(r.text, r.reward, r.status) for r in results] == [("12", 12.0, "ok"), ("1", 1.0, "ok"), ("14", 14.0, "ok")]
    assert results[0].metrics == results[2].metrics != results[1].metrics  # {"pid": ...}: one process per trajectory
    runner.finish()
    assert sorted(runner.log.read_text().split()) == ["0=14!", "1=1"]
    runner.start([{}, {}])  # a new rollout: instances start again
    assert runner.execute([ToolCall(0, "count", {})])[0].text == "1"
    runner.start([{}])  # start without finish releases the last rollout's instances first
    assert "0=1" in runner.log.read_text().split()


def test_a_timeout_restarts_a_stateful_tool(runner):
    runner.start([{}])
    assert runner.execute([ToolCall(0, "count", {})])[0].text == "1"
    assert runner.execute([ToolCall(0, "sleep", {"seconds": 1000})])[0].status == "timeout"
    assert runner.execute([ToolCall(0, "count", {})])[0].text == "1"  # the instance was lost with its process
    runner.finish()


def test_hung_calls_of_many_trajectories_time_out_side_by_side(runner):
    # 8 trajectories whose tool hangs, 2 processes: queued behind them the calls would take 4 rounds of 1 s (and a
    # respawn each); parked, they time out side by side on fresh processes while the other trajectories' calls are
    # answered: 1 s plus parking (0.25 s) plus the fresh processes' set-up (~0.2 s of CPU each on 2 cores here)
    runner.start([{}] * 10)
    calls = [ToolCall(t, "sleep", {"seconds": 1000}) for t in range(8)] + [ToolCall(t, "add", {"a": t, "b": 1}) for t in range(8, 10)]
    start = time.monotonic()
    results = runner.execute(calls)
    took = time.monotonic() - start
    print(f"8 hung tool calls on 2 workers: answered after {took:.2f} s")
    assert [r.status for r in results] == ["timeout"] * 8 + ["ok"] * 2 and [r.text for r in results[8:]] == ["9", "10"]
    assert TIMEOUT_S <= took < 2 * TIMEOUT_S + SLACK_S
    runner.finish()
    assert len(runner.pool.procs) == 2  # the pool is back to its workers


def test_a_slow_call_keeps_its_trajectorys_state_while_other_trajectories_go_on(runner):
    runner.start([{}] * 3)
    [first] = runner.execute([ToolCall(0, "count", {})])
    start = time.monotonic()
    results = runner.execute([ToolCall(0, "sleep", {"seconds": 0.8}), ToolCall(0, "count", {}), ToolCall(1, "count", {}), ToolCall(2, "count", {})])
    assert [r.text for r in results[1:]] == ["2", "1", "1"]  # trajectory 0's instance survived its parked call
    assert results[0].text == str(first.metrics["pid"]) == str(results[1].metrics["pid"])  # all in trajectory 0's process
    assert time.monotonic() - start < 0.8 + SLACK_S
    runner.finish()


def test_hung_calls_of_trajectories_sharing_a_process_end_within_two_timeouts(runner):
    # 8 trajectories with instances in the 2 processes, then every tool hangs: the calls ahead in each process time
    # out after 1 s, which frees the trajectories queued behind them (their instances died with the process): those
    # go to fresh processes and time out side by side -- about 2 timeouts (plus set-up), not 4 rounds behind 2 processes
    runner.start([{}] * 8)
    assert [r.text for r in runner.execute([ToolCall(t, "count", {}) for t in range(8)])] == ["1"] * 8
    start = time.monotonic()
    results = runner.execute([ToolCall(t, "sleep", {"seconds": 1000}) for t in range(8)])
    took = time.monotonic() - start
    print(f"8 hung tool calls of trajectories sharing 2 processes: answered after {took:.2f} s")
    assert [r.status for r in results] == ["timeout"] * 8 and 2 * TIMEOUT_S <= took < 3 * TIMEOUT_S + SLACK_S
    assert [r.text for r in runner.execute([ToolCall(t, "count", {}) for t in range(8)])] == ["1"] * 8  # instances lost
    runner.finish()
