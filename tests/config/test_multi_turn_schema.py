"""Multi-turn rollouts with tools: verl's keys compose, a good tool setup validates, and each bad setting is refused
before Ray starts with the key and the fix."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlcore.config import ConfigError, compose, validate_config

MT = "actor_rollout_ref.rollout.multi_turn"
AGENT = "actor_rollout_ref.rollout.agent"
TOOLS = "tool_configs/gsm8k_calculator.yaml"  # tests run from the repository root
BASE = compose(["recipe=tiny_cpu"])
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repository_root_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # agent_loops/ imports from the repository root, as a run started there does


def errors(**values) -> list[str]:
    """validate_config's messages for BASE with `values` set: keys under multi_turn, or "$full.key"."""
    cfg = OmegaConf.create(OmegaConf.to_container(BASE))
    for key, value in values.items():
        OmegaConf.update(cfg, key[1:] if key.startswith("$") else f"{MT}.{key}", value)
    try:
        validate_config(cfg)
    except ConfigError as err:
        return err.messages
    return []


def test_verls_keys_compose_with_verls_defaults():
    cfg = compose(["recipe=tiny_cpu", f"{MT}.enable=True", f"{MT}.tool_config_path={TOOLS}", f"{AGENT}.default_agent_loop=tool_agent"])
    assert cfg.data.tool_config_path == TOOLS  # follows multi_turn's, as in verl
    assert (cfg.actor_rollout_ref.rollout.agent.num_workers, cfg.actor_rollout_ref.rollout.multi_turn.tool_timeout_s) == (8, 30.0)
    assert compose([]).data.tool_config_path is None


def test_a_tool_setup_validates():
    assert errors(enable=True, tool_config_path=TOOLS) == []
    assert errors(**{f"${AGENT}.default_agent_loop": "tool_agent", "$data.tool_config_path": "tool_configs/tiny_add.yaml"}) == []
    assert errors(enable=True, tool_config_path=TOOLS, max_assistant_turns=5, max_user_turns=5, max_parallel_calls=2) == []
    # verl's search-R1 example names the format "qwen" (SGLang's name for hermes' <tool_call>{json}</tool_call>)
    from rlcore.rollout.agent_loop import PARSERS

    assert errors(enable=True, tool_config_path=TOOLS, format="qwen") == [] and PARSERS["qwen"] is PARSERS["hermes"]


ON = {"enable": True, "tool_config_path": TOOLS}
USER = "interactions/tiny_add.yaml"
LOOPS = "agent_loops/retry.yaml"


def test_custom_agent_loops_validate_and_a_broken_file_is_reported(tmp_path):
    assert errors(**{f"${AGENT}.agent_loop_config_path": LOOPS, f"${AGENT}.default_agent_loop": "retry_agent"}) == []
    broken = tmp_path / "loops.yaml"
    broken.write_text("- name: x\n  _target_: no.such.Loop\n")
    assert any(f"{AGENT}.agent_loop_config_path={broken}: agent loop config {broken} has 1 problem(s)" in m
               for m in errors(**{f"${AGENT}.agent_loop_config_path": str(broken)}))


def test_an_interaction_setup_validates_with_or_without_tools(tmp_path):
    assert errors(enable=True, interaction_config_path=USER) == [] and errors(**ON, interaction_config_path=USER) == []
    broken = tmp_path / "user.yaml"
    broken.write_text("interaction:\n  - name: u\n    class_name: no.such.Interaction\n")
    assert any(f"{MT}.interaction_config_path={broken}: interaction config {broken} has 1 problem(s)" in m and "no.such" in m
               for m in errors(enable=True, interaction_config_path=str(broken)))


@pytest.mark.parametrize("values, message", [
    ({"enable": True}, f"multi-turn rollouts ({MT}.enable=True or {AGENT}.default_agent_loop=tool_agent) need tools or an "
                       f"interaction; set {MT}.tool_config_path to a tool config such as tool_configs/gsm8k_calculator.yaml"),
    ({f"${AGENT}.default_agent_loop": "tool_agent"}, "need tools"),
    ({"tool_config_path": TOOLS}, f"{MT}.tool_config_path={TOOLS} gives tools, but multi-turn rollouts are off; set {MT}.enable=True"),
    ({"$data.tool_config_path": TOOLS}, f"data.tool_config_path={TOOLS} gives tools, but multi-turn rollouts are off"),
    ({**ON, "format": "chatml"}, f"{MT}.format=chatml is not one of hermes, qwen; use {MT}.format=hermes"),
    ({**ON, "tool_response_truncate_side": "start"}, f"{MT}.tool_response_truncate_side=start is not one of left, middle, right"),
    ({**ON, "max_tool_response_length": 0}, f"{MT}.max_tool_response_length=0 must be >= 1; use {MT}.max_tool_response_length=256"),
    ({**ON, "max_parallel_calls": 0}, f"{MT}.max_parallel_calls=0 must be >= 1"),
    ({**ON, "tool_timeout_s": 0}, f"{MT}.tool_timeout_s=0 must be > 0 (seconds a tool call may run); use {MT}.tool_timeout_s=30"),
    ({**ON, f"${AGENT}.num_workers": 0}, f"{AGENT}.num_workers=0 must be >= 1; use {AGENT}.num_workers=8"),
    ({f"${AGENT}.default_agent_loop": "react_agent"}, f"{AGENT}.default_agent_loop=react_agent is not one of single_turn_agent, tool_agent"),
    ({"interaction_config_path": USER}, f"{MT}.interaction_config_path={USER} gives an interaction, but multi-turn rollouts are "
                                        f"off; set {MT}.enable=True"),
    ({f"${AGENT}.agent_loop_config_path": LOOPS, f"${AGENT}.default_agent_loop": "retyr_agent"},
     f"{AGENT}.default_agent_loop=retyr_agent is not one of single_turn_agent, tool_agent, retry_agent"),
    ({f"${AGENT}.agent_loop_config_path": LOOPS, "$actor_rollout_ref.rollout.enable_rollout_routing_replay": True},
     "custom loops do not return the routes of their calls yet"),
    ({f"${AGENT}.agent_loop_config_path": LOOPS, "$actor_rollout_ref.hybrid_engine": False},
     f"{AGENT}.agent_loop_config_path with actor_rollout_ref.hybrid_engine=False: a custom loop's row does not record"),
    ({f"${AGENT}.custom_async_server.path": "server.py"}, f"{AGENT}.custom_async_server.path=server.py (custom rollout servers) is not supported"),
    ({**ON, "max_assistant_turns": 0}, f"{MT}.max_assistant_turns=0 must be >= 1"),
    ({**ON, "max_user_turns": -1}, f"{MT}.max_user_turns=-1 must be >= 1"),
])
def test_a_bad_setting_is_refused_with_its_fix(values, message):
    found = errors(**values)
    assert any(message in m for m in found), found


def test_a_broken_tool_config_is_reported_with_its_key_and_file(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: nowhere.Tool\n")
    [message] = errors(enable=True, tool_config_path=str(path))
    assert message.startswith(f"{MT}.tool_config_path={path}: tool config {path} has 2 problem(s)")
    assert "tools[0].class_name=nowhere.Tool: module nowhere cannot be imported" in message
