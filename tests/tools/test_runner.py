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
    [after] = runner.execute([ToolCall(2, "sleep", {"seconds": 0})])  # trajectory 2 goes to the same process as 0
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
