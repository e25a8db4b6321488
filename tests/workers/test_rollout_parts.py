"""What a rollout-holding worker (hybrid or split pools) builds around its engine: sampling, the agent loops."""

import torch

from rlcore.config import compose
from rlcore.rollout.agent_loop import truncate_text
from rlcore.workers import rollout_parts
from rlcore.workers.rollout_parts import sampling_params

ROLLOUT = "actor_rollout_ref.rollout"


class _Tokenizer:
    eos_token_id = 7
    pad_token_id = 0


def test_response_length_and_ignore_eos_set_the_sampling():
    cfg = compose(["recipe=tiny_cpu", f"{ROLLOUT}.response_length=13"])
    params = sampling_params(cfg, _Tokenizer(), {})
    assert params.max_tokens == 13 and params.stop_token_ids == [7]  # a response ends at EOS or after 13 tokens
    ignoring = sampling_params(compose(["recipe=tiny_cpu", f"{ROLLOUT}.ignore_eos=True"]), _Tokenizer(), {})
    assert ignoring.stop_token_ids == []  # only max_tokens ends it


def test_tool_response_truncation_keys_reach_the_agent_loop(monkeypatch):
    monkeypatch.setattr(rollout_parts, "tool_config_key_of", lambda cfg: f"{ROLLOUT}.multi_turn.tool_config_path")
    monkeypatch.setattr(rollout_parts, "load_tool_config", lambda path: [])  # no tools run here
    monkeypatch.setattr(rollout_parts, "ToolRunner", lambda *args: None)
    monkeypatch.setattr(rollout_parts, "AgentLoop", lambda engine, tokenizer, tools, settings, kwargs, interactions: settings)
    mt = f"{ROLLOUT}.multi_turn"
    cfg = compose(["recipe=tiny_cpu", f"{mt}.max_tool_response_length=6", f"{mt}.tool_response_truncate_side=left"])
    settings = rollout_parts.agent_loop(cfg, None, _Tokenizer())
    assert (settings.max_tool_response_length, settings.tool_response_truncate_side) == (6, "left")
    # What AgentLoop does with them (rlcore/rollout/agent_loop.py: each tool's text before it joins the trajectory)
    assert truncate_text("abcdefghij", settings.max_tool_response_length, settings.tool_response_truncate_side).startswith("abcdef")
    right = rollout_parts.agent_loop(compose(["recipe=tiny_cpu", f"{mt}.max_tool_response_length=6",
                                              f"{mt}.tool_response_truncate_side=right"]), None, _Tokenizer())
    assert truncate_text("abcdefghij", right.max_tool_response_length, right.tool_response_truncate_side).endswith("efghij")


def test_default_agent_loop_tool_agent_wraps_the_rollout_in_the_agent_loop(monkeypatch):
    monkeypatch.setattr(rollout_parts, "build_rollout_from_config", lambda config, pad, device, rank: "engine")
    monkeypatch.setattr(rollout_parts, "agent_loop", lambda config, rollout, tokenizer: ("agent loop around", rollout))

    def parts(loop, multi_turn=False):
        cfg = compose(["recipe=tiny_cpu", f"{ROLLOUT}.agent.default_agent_loop={loop}", f"{ROLLOUT}.multi_turn.enable={multi_turn}"])
        return rollout_parts.build_rollout_parts(cfg, _Tokenizer(), torch.device("cpu"), 0)

    assert parts("tool_agent") == ("engine", ("agent loop around", "engine"))  # multi-turn with tools, as multi_turn.enable=True
    assert parts("single_turn_agent") == ("engine", None)  # one generation per prompt
    assert parts("single_turn_agent", multi_turn=True) == ("engine", ("agent loop around", "engine"))


def test_interaction_config_path_gives_the_agent_loop_its_interactions_without_tools():
    cfg = compose(["recipe=tiny_cpu", f"{ROLLOUT}.multi_turn.enable=True",
                   f"{ROLLOUT}.multi_turn.interaction_config_path=interactions/tiny_add.yaml"])
    from rlcore.data.tokenizer import build_char_tokenizer

    loop = rollout_parts.agent_loop(cfg, None, build_char_tokenizer())
    # verl's gsm8k interaction, scoring by the tiny task's scorer (what it does: tests/tools/test_interaction.py)
    assert type(loop.interactions["tiny_add"]).__name__ == "Gsm8kInteraction" and loop.interactions["tiny_add"].data_source == "tiny_add"
    assert loop.tools.specs == {}  # no tool config: an interaction alone


def test_agent_loop_config_path_routes_rows_to_their_loops(monkeypatch):
    monkeypatch.setattr(rollout_parts, "build_rollout_from_config", lambda config, pad, device, rank: "engine")
    cfg = compose(["recipe=tiny_cpu", f"{ROLLOUT}.agent.agent_loop_config_path=agent_loops/retry.yaml",
                   f"{ROLLOUT}.agent.default_agent_loop=retry_agent"])
    monkeypatch.syspath_prepend(".")  # agent_loops/ imports from the repository root (where tests run)
    engine, runner = rollout_parts.build_rollout_parts(cfg, _Tokenizer(), torch.device("cpu"), 0)
    # The runner routes rows by agent_name (what it does with them: tests/rollout/test_agent_runner.py)
    assert engine == "engine" and runner.default == "retry_agent" and runner.tool_loop is None
    assert runner.loops["retry_agent"] == {"_target_": "agent_loops.retry_agent.RetryAgentLoop", "name": "retry_agent", "retries": 1}
