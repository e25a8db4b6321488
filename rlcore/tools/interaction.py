"""Interactions: a simulated user or environment that answers the assistant (verl's `verl.interactions`).

The tool agent (rlcore.rollout.agent_loop) hands an interaction every assistant turn that called no tool: it answers
with a user message, may end the episode, and scores the turn. Its messages are context, masked out of the loss
like tool responses; its turn scores reach the reward function as `extra_info["turn_scores"]`, in order.

A class has verl's lifecycle, so a verl interaction runs once `from verl.interactions.base import BaseInteraction`
reads `from rlcore.tools.interaction import BaseInteraction`:

    start_interaction(instance_id, **interaction_kwargs) -> instance_id     # once per trajectory
    generate_response(instance_id, messages, **interaction_kwargs)
        -> (should_terminate, text, turn_score | None, metrics)              # after each assistant turn
    calculate_score(instance_id, **kwargs) -> float
    finalize_interaction(instance_id, **kwargs)                             # once, when the trajectory ends

all `async`. One instance per configured name serves every trajectory of a rollout worker (keep per-trajectory
state under `instance_id`, as verl's do). They run in the rollout worker's process, on one event loop.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any
from uuid import uuid4

from rlcore.config.interaction_config import InteractionSpec
from rlcore.reward.scorers import default_compute_score


class BaseInteraction:
    """verl's base class: a fixed answer, score 0, never ends the episode; subclasses override what they need."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or uuid4().hex

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
                                ) -> tuple[bool, str, float | None, dict[str, Any]]:
        return False, "Your current result seems acceptable.", 0.0, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's gsm8k interaction: scores the last assistant message against the row's ground truth; a correct one
    ends the episode ("Your response is correct!"), a wrong one asks for another try. The scorer is the one
    registered for `config["data_source"]` (default "openai/gsm8k", verl's strict `#### <answer>` format), so the
    same class runs on the tiny task with `config: {data_source: tiny_add}`; `correct_message` and
    `incorrect_message` replace verl's texts (a 64-position model has no room for them)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.data_source = config.get("data_source", "openai/gsm8k")
        self.correct = config.get("correct_message", "Your response is correct!")
        self.incorrect = config.get("incorrect_message", "Your response is incorrect! You need to reflect on your answer and try again.")
        self.instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid4().hex
        self.instances[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
                                ) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self.instances[instance_id]["response"] = last
        score = await self.calculate_score(instance_id)
        return (True, self.correct, score, {}) if score == 1.0 else (False, self.incorrect, score, {})

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        state = self.instances[instance_id]
        return float(default_compute_score(self.data_source, state["response"], state["ground_truth"]))

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self.instances.pop(instance_id, None)


def build_interactions(specs: list[InteractionSpec]) -> dict[str, Any]:
    """name -> the interaction instance (classes already checked by rlcore.config.interaction_config)."""
    built = {}
    for spec in specs:
        module, _, attr = spec.class_name.rpartition(".")
        built[spec.name] = getattr(importlib.import_module(module), attr)(config=dict(spec.config))
    return built


class InteractionSession:
    """One trajectory's interaction: which instance answers it, under which id, with the row's kwargs."""

    def __init__(self, interaction: Any, kwargs: dict[str, Any]) -> None:
        self.interaction, self.kwargs, self.instance_id = interaction, dict(kwargs), uuid4().hex

    async def start(self) -> None:
        self.instance_id = await self._call("start_interaction", self.instance_id, **self.kwargs) or self.instance_id

    async def respond(self, messages: list[dict[str, Any]]) -> tuple[bool, str, float | None, dict[str, Any]]:
        stop, text, score, metrics = await self._call("generate_response", self.instance_id, messages, **self.kwargs)
        return bool(stop), str(text), None if score is None else float(score), dict(metrics or {})

    async def finish(self) -> None:
        await self._call("finalize_interaction", self.instance_id)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self.interaction, method)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 -- the user's class; the step stops with its name
            name = f"{type(self.interaction).__module__}.{type(self.interaction).__qualname__}"
            raise RuntimeError(f"interaction {self.kwargs.get('name')!r} ({name}).{method} raised {type(err).__name__}: {err}; "
                               "fix the interaction (multi_turn.interaction_config_path)") from err


def run_all(events: asyncio.AbstractEventLoop, coroutines: list) -> list:
    """The coroutines' results, run side by side on the worker's interaction event loop."""
    async def gather():
        return await asyncio.gather(*coroutines)
    return events.run_until_complete(gather()) if coroutines else []
