"""What a custom agent loop imports: verl's names and shapes, rlcore's classes.

A verl agent loop runs in rlcore once its imports are changed:

    verl.experimental.agent_loop.AgentLoopBase       -> rlcore.rollout.agent_api.AgentLoopBase
    verl.experimental.agent_loop.AgentLoopOutput     -> rlcore.rollout.agent_api.AgentLoopOutput
    verl.experimental.agent_loop.agent_loop.register -> rlcore.rollout.agent_api.register
    verl.workers.rollout.replica.TokenOutput          -> rlcore.rollout.agent_api.TokenOutput
    verl.interactions.base.BaseInteraction            -> rlcore.tools.interaction.BaseInteraction

A loop is built once per row, with verl's constructor arguments (the trainer config, the server, the tokenizer; the
processor and dataset class are None: text models only), and `await loop.run(sampling_params, **row)` returns the
row's trajectory. `row` holds the batch's non-tensor columns for that row, as verl passes them: `raw_prompt` (the
chat messages), `extra_info`, `data_source`, `reward_model`, `index`, `agent_name`, `tools_kwargs`, ... The server
(`self.server_manager`, rlcore.rollout.agent_server) takes token ids and returns token ids with their log-probs:
what the trainer trains on is exactly what was sampled.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenOutput:
    """One generation: the sampled ids and their log-probs under the rollout's weights (verl's TokenOutput)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None  # "completed" (a stop token ended it) | "length" (the budget did)
    num_preempted: int | None = None


@dataclass
class AgentLoopOutput:
    """A row's trajectory (verl's AgentLoopOutput). `response_ids` holds everything after the prompt: sampled ids
    (`response_mask` 1, trained on) and the ids the loop appended itself (tool or user turns, mask 0)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None  # the server's log-probs of the sampled ids, 0.0 elsewhere
    routed_experts: Any = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None  # the trajectory's reward, if the loop scored it (compute_score is not called)
    num_turns: int = 0
    metrics: Any = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)  # "turn_scores": list reaches compute_score's extra_info


class DictConfigWrap:
    """verl's wrapper of the trainer config handed to a loop's constructor (`.config`)."""

    def __init__(self, config: Any) -> None:
        self.config = config


class AgentLoopBase(ABC):
    """verl's agent-loop base class: built per row by the rollout worker, talks to `server_manager` in token ids."""

    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any = None,
                 dataset_cls: Any = None, dataset_config: DictConfigWrap | None = None, **kwargs: Any) -> None:
        self.config = trainer_config.config
        self.server_manager, self.tokenizer, self.processor, self.dataset_cls = server_manager, tokenizer, processor, dataset_cls
        self.dataset_config = dataset_config.config if dataset_config is not None else None
        self.apply_chat_template_kwargs = dict((self.dataset_config or {}).get("apply_chat_template_kwargs") or {})
        self.loop = asyncio.get_event_loop()

    async def process_vision_info(self, messages: list[dict]) -> dict:
        return {}  # text models only (issue 61 brings vision-language models)

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, images: Any = None,
                                  videos: Any = None, remove_system_prompt: bool = False) -> list[int]:
        """The messages rendered by the model's chat template with the generation prompt, as ids. With
        `remove_system_prompt`, what the template adds before any message (a default system turn) is cut, so the
        ids can be appended to a conversation (verl's use: a tool or user turn)."""
        ids = self._render(messages, tools)
        if remove_system_prompt:
            prefix = self._render([], None, generation_prompt=False)
            if prefix and ids[: len(prefix)] == prefix:
                ids = ids[len(prefix):]
        return ids

    def _render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> list[int]:
        if not messages:
            try:
                return self._ids(self.tokenizer.apply_chat_template([], tokenize=True, add_generation_prompt=False,
                                                                    **self.apply_chat_template_kwargs))
            except Exception:  # noqa: BLE001 -- a template that needs a message has no prefix of its own
                return []
        return self._ids(self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                                            add_generation_prompt=generation_prompt, **self.apply_chat_template_kwargs))

    @staticmethod
    def _ids(rendered: Any) -> list[int]:
        return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """The row's trajectory. `sampling_params`: temperature, top_p, top_k, repetition_penalty, logprobs."""


_agent_loop_registry: dict[str, dict] = {}  # name -> {"_target_": "module.Class"}: loops registered by decorator


def register(agent_name: str):
    """verl's decorator: `@register("my_agent")` on a loop class makes rows with agent_name "my_agent" use it
    (its module must be imported in the rollout worker: listing it in agent_loop_config_path does that)."""

    def decorator(cls: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
        return cls

    return decorator
