"""The multi-turn part of the rollout's config tree (`actor_rollout_ref.rollout.multi_turn.*`, `...rollout.agent.*`),
in its own module to keep schema.py short; same conventions as schema.py (verl's names and defaults, enumerations as
`str` with the allowed values in the comment, checked by the rules below)."""

import os
from dataclasses import dataclass, field
from typing import Optional

from rlcore.config.agent_loop_config import BUILTIN_AGENT_LOOPS, load_agent_loop_config
from rlcore.config.async_schema import split_pools
from rlcore.config.interaction_config import load_interaction_config
from rlcore.config.names import TOOL_CALL_FORMATS
from rlcore.config.tool_config import AGENT, MT, load_tool_config, tool_config_key_of, tools_enabled


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (`actor_rollout_ref.rollout.multi_turn.*`): the model's hermes tool calls are run
    by rlcore.tools.runner and their results appended as tool turns (agent.default_agent_loop=tool_agent); an
    interaction (a simulated user, rlcore.tools.interaction) answers each turn that calls no tool."""

    enable: bool = False  # multi-turn generation with tool calls (same as agent.default_agent_loop=tool_agent)
    max_assistant_turns: Optional[int] = None  # cap on assistant turns per sample; None = until response_length
    tool_config_path: Optional[str] = None  # verl tool-config YAML (tool_configs/*.yaml)
    function_tool_path: Optional[str] = None  # verl 0.9: a Python file of plain functions made tools (refused: use tool_config_path)
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


# ---------------------------------------------------------------------------------------------------- rules
# Rules for multi-turn rollouts with tools (`actor_rollout_ref.rollout.multi_turn.*`, `actor_rollout_ref.rollout.agent.*`,
# `data.tool_config_path`). `c` is validate's checker (get / error / choice / at_least). The tool config is loaded here,
# before Ray starts, so a missing file or a tool class that does not import fails in seconds with its fix.


TRUNCATE_SIDES = ("left", "middle", "right")
# Keys of verl features rlcore does not have yet: what each would need.
_UNSUPPORTED = {f"{AGENT}.custom_async_server.path": "custom rollout servers"}


def check_multi_turn(c) -> None:
    custom = custom_loop_names(c)
    if custom is not None:  # None: the loops' file is not on this machine, so their names are unknown
        c.choice(f"{AGENT}.default_agent_loop", (*BUILTIN_AGENT_LOOPS, *custom))
    for key, feature in _UNSUPPORTED.items():
        if c.get(key):
            c.error(f"{key}={c.get(key)} ({feature}) is not supported yet by rlcore; unset it ({key}=null)")
    for key in (f"{MT}.function_tool_path", "data.function_tool_path"):  # data's follows the rollout's: one message
        if c.get(key):
            c.error(f"{key}={c.get(key)}: verl 0.9's tools made from a Python file's plain functions are not supported yet "
                    f"by rlcore; describe them in a tool config (verl's YAML, e.g. tool_configs/gsm8k_calculator.yaml) and "
                    f"set {MT}.tool_config_path")
            break
    key = tool_config_key_of(c.cfg)
    mt = c.cfg.actor_rollout_ref.rollout.multi_turn
    interactions = mt.interaction_config_path
    if not tools_enabled(c.cfg):
        if key:
            c.error(f"{key}={c.get(key)} gives tools, but multi-turn rollouts are off; set {MT}.enable=True to let the model "
                    f"call them, or drop {key}")
        if interactions:
            c.error(f"{MT}.interaction_config_path={interactions} gives an interaction, but multi-turn rollouts are off; set "
                    f"{MT}.enable=True (interactions answer the tool agent's turns, as in verl)")
        return
    if interactions and os.path.isfile(os.path.expanduser(str(interactions))):  # a missing file: as the tool config's
        try:
            load_interaction_config(os.path.expanduser(str(interactions)))
        except ValueError as err:
            c.error(f"{MT}.interaction_config_path={interactions}: {err}")
    if key is None and not interactions:
        c.error(f"multi-turn rollouts ({MT}.enable=True or {AGENT}.default_agent_loop=tool_agent) need tools or an "
                f"interaction; set {MT}.tool_config_path to a tool config such as tool_configs/gsm8k_calculator.yaml, or "
                f"{MT}.interaction_config_path to an interaction config such as interactions/tiny_add.yaml")
    elif key is not None and os.path.isfile(os.path.expanduser(str(c.get(key)))):
        # A file that is not there is a path on the machine that runs the job: rlcore.cli.preflight reports it,
        # a warning when the doctor plans for another machine (--elsewhere), an error before a run starts.
        try:
            load_tool_config(c.get(key))
        except ValueError as err:
            c.error(f"{key}={c.get(key)}: {err}")
    c.choice(f"{MT}.format", TOOL_CALL_FORMATS)
    c.choice(f"{MT}.tool_response_truncate_side", TRUNCATE_SIDES)
    c.at_least(f"{MT}.max_tool_response_length", 1, fix=256)
    c.at_least(f"{MT}.max_parallel_calls", 1)
    timeout = mt.tool_timeout_s
    if timeout is None or timeout <= 0:
        c.error(f"{MT}.tool_timeout_s={timeout} must be > 0 (seconds a tool call may run); use {MT}.tool_timeout_s=30")
    c.at_least(f"{AGENT}.num_workers", 1, fix=8)
    for turns in ("max_assistant_turns", "max_user_turns"):
        if getattr(mt, turns) is not None:
            c.at_least(f"{MT}.{turns}", 1, fix=5)


def custom_loop_names(c) -> list[str] | None:
    """The loops of agent.agent_loop_config_path (checked here: its problems are errors), and the combinations with
    them that are not built yet, refused with why."""
    path = c.cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path
    if not path:
        return []
    if c.cfg.actor_rollout_ref.rollout.enable_rollout_routing_replay:
        c.error(f"{AGENT}.agent_loop_config_path with actor_rollout_ref.rollout.enable_rollout_routing_replay=True: custom loops "
                "do not return the routes of their calls yet (the tool agent does); drop one of them")
    if split_pools(c.get):
        c.error(f"{AGENT}.agent_loop_config_path with actor_rollout_ref.hybrid_engine=False: a custom loop's row does not record "
                "the weight versions of its calls yet, which async training's staleness accounting reads; use the hybrid engine")
    if not os.path.isfile(os.path.expanduser(str(path))):
        return None  # rlcore.cli.preflight names a missing file (a warning when planning for another machine)
    try:
        return [spec.name for spec in load_agent_loop_config(os.path.expanduser(str(path)))]
    except ValueError as err:
        c.error(f"{AGENT}.agent_loop_config_path={path}: {err}")
        return []
