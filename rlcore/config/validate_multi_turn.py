"""Rules for multi-turn rollouts with tools (`actor_rollout_ref.rollout.multi_turn.*`, `actor_rollout_ref.rollout.agent.*`,
`data.tool_config_path`). `c` is validate's checker (get / error / choice / at_least). The tool config is loaded here,
before Ray starts, so a missing file or a tool class that does not import fails in seconds with its fix."""

from __future__ import annotations

import os

from rlcore.config.interaction_config import load_interaction_config
from rlcore.config.tool_config import AGENT, MT, load_tool_config, tool_config_key_of, tools_enabled

AGENT_LOOPS = ("single_turn_agent", "tool_agent")
TRUNCATE_SIDES = ("left", "middle", "right")
FORMATS = ("hermes", "qwen")  # rlcore.rollout.agent_loop.PARSERS' (qwen: SGLang's name for hermes' format)
# Keys of verl features rlcore does not have yet: what each would need.
_UNSUPPORTED = {f"{AGENT}.agent_loop_config_path": "custom agent loops",
                f"{AGENT}.custom_async_server.path": "custom rollout servers"}


def check_multi_turn(c) -> None:
    c.choice(f"{AGENT}.default_agent_loop", AGENT_LOOPS)
    for key, feature in _UNSUPPORTED.items():
        if c.get(key):
            c.error(f"{key}={c.get(key)} ({feature}) is not supported yet by rlcore; unset it ({key}=null)")
    key = tool_config_key_of(c.cfg)
    interactions = c.get(f"{MT}.interaction_config_path")
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
    c.choice(f"{MT}.format", FORMATS)
    c.choice(f"{MT}.tool_response_truncate_side", TRUNCATE_SIDES)
    c.at_least(f"{MT}.max_tool_response_length", 1, fix=256)
    c.at_least(f"{MT}.max_parallel_calls", 1)
    timeout = c.get(f"{MT}.tool_timeout_s")
    if timeout is None or timeout <= 0:
        c.error(f"{MT}.tool_timeout_s={timeout} must be > 0 (seconds a tool call may run); use {MT}.tool_timeout_s=30")
    c.at_least(f"{AGENT}.num_workers", 1, fix=8)
    for turns in ("max_assistant_turns", "max_user_turns"):
        if c.get(f"{MT}.{turns}") is not None:
            c.at_least(f"{MT}.{turns}", 1, fix=5)
