"""The multi-turn part of the rollout's config tree (`actor_rollout_ref.rollout.multi_turn.*`, `...rollout.agent.*`),
in its own module to keep schema.py short; same conventions as schema.py (verl's names and defaults, enumerations as
`str` with the allowed values in the comment, checked by validate_multi_turn.py)."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (`actor_rollout_ref.rollout.multi_turn.*`): the model's hermes tool calls are run
    by rlcore.tools.runner and their results appended as tool turns (agent.default_agent_loop=tool_agent); an
    interaction (a simulated user, rlcore.tools.interaction) answers each turn that calls no tool."""

    enable: bool = False  # multi-turn generation with tool calls (same as agent.default_agent_loop=tool_agent)
    max_assistant_turns: Optional[int] = None  # cap on assistant turns per sample; None = until response_length
    tool_config_path: Optional[str] = None  # verl tool-config YAML (tool_configs/*.yaml)
    max_user_turns: Optional[int] = None  # cap on user (tool-result) turns per sample; None = no cap
    max_parallel_calls: int = 1  # tool calls of one turn that are executed; later ones are dropped
    max_tool_response_length: int = 256  # CHARACTERS of a tool's response text kept (verl truncates the text)
    tool_response_truncate_side: str = "middle"  # which part of a long tool response is cut: left | middle | right
    interaction_config_path: Optional[str] = None  # verl's interaction YAML (name, class_name, config); rows pick one by extra_info.interaction_kwargs.name
    use_inference_chat_template: bool = False  # apply the model's chat template as at inference
    tokenization_sanity_check_mode: str = "strict"  # strict | ignore_strippable | disable
    format: str = "hermes"  # tool-call format: hermes (<tool_call>{json}</tool_call>, Qwen2.5 / Qwen3)
    num_repeat_rollouts: Optional[int] = None  # interaction rollouts per sample
    tool_timeout_s: float = 30.0  # rlcore addition: seconds a tool call may run before its process is killed (an error result)


@dataclass
class CustomAsyncServerConfig:
    """A user-provided rollout server class (`actor_rollout_ref.rollout.agent.custom_async_server.*`); not supported yet."""

    path: Optional[str] = None  # Python file defining the server class
    name: Optional[str] = None  # class name in that file


@dataclass
class AgentConfig:
    """The agent loop that drives each rollout sample (`actor_rollout_ref.rollout.agent.*`)."""

    num_workers: int = 8  # rlcore: tool processes per rollout worker (verl: agent-loop workers)
    default_agent_loop: str = "single_turn_agent"  # single_turn_agent | tool_agent (multi-turn with tools) | a custom loop's name
    agent_loop_config_path: Optional[str] = None  # verl's YAML list of custom agent loops (a name, a target class, its kwargs); rows pick by agent_name
    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)  # not supported yet
