"""Misbehaving and stateful tools for tests and docs (importable by class_name in spawned tool processes)."""

from __future__ import annotations

import os
import time
from typing import Any

from rlcore.tools.base import BaseTool


def schema(name: str, required: tuple[str, ...] = ()) -> dict:
    """An OpenAI function schema whose parameters are `required`, each any JSON value."""
    return {"type": "function", "function": {"name": name, "description": f"test tool {name}", "parameters": {
        "type": "object", "properties": {key: {"description": key} for key in required}, "required": list(required)}}}


class RaisingTool(BaseTool):
    """Raises ValueError("bad input <parameters>") on every call."""

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> str:
        raise ValueError(f"bad input {parameters}")


class SleepingTool(BaseTool):
    """Sleeps parameters["seconds"] (a hung tool when large), then returns its process id."""

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> str:
        time.sleep(parameters["seconds"])
        return str(os.getpid())


class ExitingTool(BaseTool):
    """Kills its own process with os._exit, as a crashing native extension would."""

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> str:
        os._exit(3)


class CounterTool(BaseTool):
    """Stateful: counts its calls per instance, starting from create_kwargs["start"]; the step reward is the count,
    execute_kwargs["step"] (default 1) is added per call, and release records the final count in config["log"]."""

    def __init__(self, config: dict, tool_schema: dict) -> None:
        super().__init__(config, tool_schema)
        self.counts: dict[str, int] = {}

    def create(self, instance_id: str, **create_kwargs: Any) -> str:
        self.counts[instance_id] = create_kwargs.get("start", 0)
        return instance_id

    def execute(self, instance_id: str, parameters: dict, step: int = 1, **execute_kwargs: Any) -> tuple[Any, float, dict]:
        self.counts[instance_id] += step
        return self.counts[instance_id], float(self.counts[instance_id]), {"pid": os.getpid()}

    def release(self, instance_id: str, **release_kwargs: Any) -> None:
        log = self.config.get("log")
        if log:  # a file, since the tool lives in another process than the test
            with open(log, "a") as f:
                f.write(f"{instance_id}={self.counts.pop(instance_id)}{release_kwargs.get('suffix', '')}\n")
