"""The tool interface, verl's lifecycle made synchronous: a tool runs inside a tool process (rlcore.tools.runner),
one call at a time, so it needs no event loop and a blocking call only blocks its own process."""

from __future__ import annotations

from typing import Any


class BaseTool:
    """A tool the model can call. One object per tool process serves every trajectory routed there: per-trajectory
    state lives under the `instance_id` that `create` returns and `release` ends.

    Subclasses set their behaviour in `execute`; `create` and `release` keep no state by default."""

    def __init__(self, config: dict, tool_schema: dict) -> None:
        self.config = config  # the tool config entry's `config`
        self.tool_schema = tool_schema  # OpenAI function schema, as shown to the model

    @property
    def name(self) -> str:
        """The name the model calls the tool by (tool_schema.function.name)."""
        return self.tool_schema["function"]["name"]

    def create(self, instance_id: str, **create_kwargs: Any) -> str:
        """Starts the tool's state for one trajectory (verl's extra_info.tools_kwargs[name].create_kwargs, e.g. the
        ground truth); returns the instance id that execute and release get."""
        return instance_id

    def execute(self, instance_id: str, parameters: dict, **execute_kwargs: Any) -> tuple[str, float | None, dict]:
        """Runs one call with the model's arguments: (text the model sees, step reward or None, metrics). Returning a
        plain str is allowed and means (text, None, {}). Raise on bad arguments: the runner shows the model the error."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute")

    def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Ends the trajectory's state (called once per created instance when the rollout finishes)."""
