"""Runs the model's tool calls isolated in processes, with a time limit per call: a tool that raises, hangs or kills
its process costs that call an error text for the model, never the rollout step.

`num_workers` spawned processes each build every tool once (rlcore.utils.process_pool runs them). A trajectory's
first call goes to any free process and its later calls to the same one (the trajectory is the pool's key), so a
stateful tool keeps one trajectory's instance in one place; calls of different trajectories run side by side. A
process whose call passes `timeout_s`, or that dies, is killed and replaced: the instances it held are lost (every
trajectory whose instances lived there) and are created again on their next call, which may go to any process, so
a stateful tool restarts from its create_kwargs after a timeout.

A call past the pool's suspect time is parked: it keeps its process (and its trajectory's instances there), while
fresh processes take the calls of trajectories that have no instances yet or lost them; a trajectory whose instances
share the parked call's process waits for it rather than silently losing its state. So hung calls of many
trajectories in one `execute` time out side by side, within about two `timeout_s` (one for the calls ahead in a
shared process, one for the calls behind them, which go elsewhere once it is killed), up to the pool's process cap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from rlcore.config.tool_config import ToolSpec
from rlcore.utils.process_pool import ProcessPool, call_catching, serve


@dataclass
class ToolCall:
    """A call parsed from trajectory `trajectory`'s turn (rlcore.tools.parser.ParsedCall plus its row)."""

    trajectory: int  # index of the trajectory (row) making the call
    name: str | None
    arguments: dict | None
    error: str | None = None  # parse error: not executed, returned as the result text with status "error"


@dataclass
class ToolResult:
    """What a call gave: the text the model sees next, the tool's step reward and metrics, and how it ended."""

    text: str
    reward: float | None
    metrics: dict
    status: str  # "ok" | "error" | "timeout"


class _ToolHost:
    """The tools of one process and the instances it created: {(instance_id, tool name): id from create}."""

    def __init__(self, specs: list[ToolSpec]) -> None:
        self.tools: dict[str, Any] = {}
        for spec in specs:
            module, _, attr = spec.class_name.rpartition(".")
            ok, tool = call_catching(lambda: getattr(importlib.import_module(module), attr)(spec.config, spec.tool_schema))
            self.tools[spec.name] = tool if ok else RuntimeError(f"tool {spec.name} ({spec.class_name}) could not be built: {tool}")
        self.instances: dict[tuple[str, str], str] = {}

    def handle(self, request: tuple) -> tuple[bool, Any]:
        kind, payload = request
        return call_catching(self.execute, **payload) if kind == "execute" else (True, self.release(**payload))

    def execute(self, instance_id: str, name: str, arguments: dict, kwargs: dict) -> tuple[Any, ...]:
        tool = self.tools[name]
        if isinstance(tool, Exception):
            raise tool
        key = (instance_id, name)
        if key not in self.instances:  # first call of this trajectory here (or since this process replaced one)
            self.instances[key] = tool.create(instance_id, **kwargs.get("create_kwargs", {}))
        result = tool.execute(self.instances[key], arguments, **kwargs.get("execute_kwargs", {}))
        if not isinstance(result, tuple):
            return result, None, {}
        if len(result) != 3:
            raise TypeError(f"{type(tool).__name__}.execute returned a {len(result)}-tuple; return (text, reward, metrics) or a str")
        return result

    def release(self, instance_id: str, release_kwargs: dict[str, dict]) -> int:
        """Releases one trajectory's instances ({tool name: release_kwargs}; best effort: a failing release is
        skipped); returns how many failed."""
        failed = 0
        for key in [key for key in self.instances if key[0] == instance_id]:
            created_id = self.instances.pop(key)
            failed += not call_catching(self.tools[key[1]].release, created_id, **release_kwargs.get(key[1], {}))[0]
        return failed


def _serve_tools(conn: Connection, specs: list[ToolSpec]) -> None:
    """A tool process: builds the tools once, then serves execute / release requests until the pipe closes."""
    serve(conn, _ToolHost(specs).handle)


class ToolRunner:
    """Executes ToolCalls for the trajectories of one rollout at a time: `start`, `execute` per turn, `finish`.

    Use as a context manager (or call `close`) to stop the processes."""

    def __init__(self, specs: list[ToolSpec], num_workers: int, timeout_s: float) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self.pool = ProcessPool(_serve_tools, (specs,), num_workers, timeout_s)
        self.tools_kwargs: list[dict] = []
        self.started = False

    def start(self, tools_kwargs: list[dict]) -> None:
        """Begins a rollout: one entry per trajectory, verl's extra_info.tools_kwargs {tool name: {"create_kwargs":
        ..., "execute_kwargs": ..., "release_kwargs": ...}}. Instances are created at each trajectory's first call."""
        if self.started:  # instance ids restart at "0": the last rollout's instances must not leak into this one
            self.finish()
        self.tools_kwargs, self.started = [kwargs or {} for kwargs in tools_kwargs], True

    def execute(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One ToolResult per call, in call order. Calls of one trajectory run one after another, in its process."""
        results: list[ToolResult | None] = [self._refuse(call) for call in calls]
        todo = [i for i, result in enumerate(results) if result is None]
        requests = [("execute", {"instance_id": str(calls[i].trajectory), "name": calls[i].name, "arguments": calls[i].arguments or {},
                                 "kwargs": self._kwargs(calls[i].trajectory).get(calls[i].name, {})}) for i in todo]
        outcomes = self.pool.run(requests, [calls[i].trajectory for i in todo])
        for i, outcome in zip(todo, outcomes):
            results[i] = self._result(calls[i].name, outcome)
        return results  # type: ignore[return-value]  # every call has its result now

    def _kwargs(self, trajectory: int) -> dict:
        return self.tools_kwargs[trajectory] if trajectory < len(self.tools_kwargs) else {}

    def _refuse(self, call: ToolCall) -> ToolResult | None:
        """The error result of a call that is not run (parse error, unknown tool, missing arguments), else None."""
        if call.error is not None:
            return ToolResult(call.error, None, {}, "error")
        if call.name not in self.specs:
            return ToolResult(f"error: there is no tool {call.name!r}; available tools: {', '.join(self.specs)}", None, {}, "error")
        params = self.specs[call.name].tool_schema["function"]["parameters"]
        missing = [key for key in params.get("required", []) if key not in (call.arguments or {})]
        if missing:
            return ToolResult(f"error: tool {call.name} needs the argument(s) {', '.join(missing)}", None, {}, "error")
        return None

    def _result(self, name: str, outcome) -> ToolResult:
        if outcome.status == "ok":
            text, reward, metrics = outcome.value
            return ToolResult(text if isinstance(text, str) else str(text), reward, dict(metrics or {}), "ok")
        if outcome.status == "timeout":
            return ToolResult(f"error: tool {name} timed out after {self.timeout_s:g}s", None, {}, "timeout")
        if outcome.status == "died":
            return ToolResult(f"error: tool {name} crashed its process", None, {}, "error")
        return ToolResult(f"error: {outcome.value}", None, {}, "error")

    def finish(self) -> None:
        """Releases every trajectory's tool instances in their processes (best effort, each bounded by timeout_s)."""
        held = self.pool.held_keys()  # a trajectory whose process was killed or died has no instances left
        requests = [("release", {"instance_id": str(t), "release_kwargs": {name: kwargs.get("release_kwargs", {})
                                                                           for name, kwargs in self._kwargs(t).items()}}) for t in held]
        if requests:
            self.pool.run(requests, held)
        self.pool.forget_keys()
        self.started = False

    def close(self) -> None:
        """Stops the tool processes."""
        self.pool.close()

    def __enter__(self) -> "ToolRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
