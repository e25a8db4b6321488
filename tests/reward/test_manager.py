"""Reward managers: the score on each response's last token, and DAPO's soft overlong punishment by hand."""

import numpy as np
import pytest
import torch

from rlcore.config.names import REWARD_MANAGERS as VALIDATED_NAMES
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.protocol import DataProto
from rlcore.reward.manager import REWARD_MANAGERS, build_reward_manager


def batch(lengths, response_len=10, sources=None):
    mask = (torch.arange(response_len)[None] < torch.tensor(lengths)[:, None]).long()
    n = len(lengths)
    return DataProto.from_dict(
        {"responses": torch.full((n, response_len), 7) * mask, "response_mask": mask, "attention_mask": mask},  # no prompt columns
        {"data_source": sources or ["any"] * n, "reward_model": [{"ground_truth": "x"}] * n},
    )


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def test_naive_puts_the_score_on_the_last_response_token():
    manager = build_reward_manager("naive", build_char_tokenizer(), always_one, "data_source", {})
    scores, extras = manager(batch([3, 0, 10]))
    assert scores[0, 2] == 1.0 and scores[0].sum() == 1.0
    assert scores[1].sum() == 0.0  # an empty response has no token to carry the score
    assert scores[2, 9] == 1.0 and extras == {}


def scored_with_extras(data_source, solution_str, ground_truth, extra_info=None):
    if len(solution_str) == 1:
        return 0.5  # no extras for this one
    return {"score": 1.0, "acc": len(solution_str) == 3, "pred": solution_str[:2], "hits": np.int64(len(solution_str))}


def test_text_extras_pass_through_numbers_become_floats_and_a_missing_key_is_none():
    manager = build_reward_manager("naive", build_char_tokenizer(), scored_with_extras, "data_source", {})
    scores, extras = manager(batch([3, 1, 4]))  # token 7 is the character "1"
    assert scores.sum(-1).tolist() == [1.0, 0.5, 1.0]
    assert extras == {"acc": [1.0, None, 0.0], "pred": ["11", None, "11"], "hits": [3.0, None, 4.0]}
    assert type(extras["acc"][0]) is float and type(extras["hits"][0]) is float


def test_the_registered_extractor_supplies_pred_when_the_scorer_gives_none():
    manager = build_reward_manager("naive", build_char_tokenizer(), always_one, "data_source", {})
    _, extras = manager(batch([2, 3, 0], sources=["tiny_add", "any", "tiny_add"]))
    assert extras == {"pred": ["11", None, ""]}  # tiny_add: the stripped response; "any" has no extractor
    manager = build_reward_manager("naive", build_char_tokenizer(), scored_with_extras, "data_source", {})
    _, extras = manager(batch([2], sources=["tiny_add"]))
    assert extras["pred"] == ["11"]  # the scorer's own pred wins (here the same text)
    _, extras = manager(batch([4], sources=["gsm8k"]))
    assert extras["pred"] == ["11"]  # the scorer's, not the gsm8k extractor's None


def test_dapo_overlong_penalty_by_hand():
    # max_resp_len 10, buffer 4: no penalty up to 6 tokens, then -1.0 x excess / 4, reaching -1.0 at 10 tokens.
    kwargs = {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True}}
    manager = build_reward_manager("dapo", build_char_tokenizer(), always_one, "data_source", kwargs)
    scores, extras = manager(batch([5, 6, 8, 10]))
    assert scores.sum(-1).tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert extras["overlong_reward"] == pytest.approx([0.0, 0.0, -0.5, -1.0])
    assert extras["overlong"] == [0.0, 0.0, 1.0, 1.0]


def test_dapo_without_the_buffer_is_naive():
    manager = build_reward_manager("dapo", build_char_tokenizer(), always_one, "data_source", {"max_resp_len": 10})
    scores, extras = manager(batch([10]))
    assert scores.sum().item() == 1.0 and extras == {}


def test_the_validator_knows_every_manager():
    assert set(VALIDATED_NAMES) == set(REWARD_MANAGERS)


def test_the_trainer_builds_the_configured_manager_from_verl_keys():
    from rlcore.config import compose
    from rlcore.reward.manager import DapoRewardManager
    from rlcore.trainer.setup import build_reward_fns

    cfg = compose(["recipe=tiny_cpu", "reward.reward_manager.name=dapo", "+reward.reward_kwargs.max_resp_len=5",
                   "+reward.reward_kwargs.overlong_buffer_cfg.enable=True", "+reward.reward_kwargs.overlong_buffer_cfg.len=2",
                   "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5"])
    reward_fn, _ = build_reward_fns(cfg, build_char_tokenizer())
    assert isinstance(reward_fn, DapoRewardManager) and reward_fn.max_resp_len == 5
    assert reward_fn.shape_score(1.0, 5, {}) == pytest.approx(0.5)  # 2 tokens past 3: -0.5 x 2 / 2


def outcome_plus_tool_rewards(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) + extra_info["tool_rewards"]


def test_a_multi_turn_trajectory_is_scored_whole_with_its_tools_step_rewards():
    """Tool responses are not sampled (response_mask 0) but part of the text the scorer reads (the attention mask
    counts them); the tools' step rewards reach the scorer as extra_info["tool_rewards"]."""
    manager = build_reward_manager("naive", build_char_tokenizer(), outcome_plus_tool_rewards, "data_source", {})
    data = batch([2, 5])
    data.batch["attention_mask"] = torch.cat([torch.ones(2, 3, dtype=torch.long), data.batch["response_mask"]], -1)
    data.batch["response_mask"] = torch.tensor([[1, 1] + [0] * 8, [1, 0, 0, 0, 1] + [0] * 5])  # 3 tool tokens in row 1
    data.batch["tool_rewards"] = torch.tensor([0.0, 0.25])
    scores, _ = manager(data)
    assert scores[0, 1] == 2.0 and scores[1, 4] == 5.25 and scores.sum() == 7.25  # on each trajectory's last token
    # An interaction's turn scores reach the scorer in order as extra_info["turn_scores"] (verl's), here the last one.
    data.non_tensor_batch["turn_scores"] = np.array([[0.0, 1.0], [0.5]] + [None], dtype=object)[:2]
    last_turn = build_reward_manager("naive", build_char_tokenizer(), lambda extra_info=None, **_: extra_info["turn_scores"][-1],
                                     "data_source", {})
    assert last_turn(data)[0].sum(-1).tolist() == [1.0, 0.5]
    # A row an agent loop scored itself (verl's AgentLoopOutput.reward_score) keeps that score, unscored here.
    data.batch["agent_reward"] = torch.tensor([float("nan"), -2.0])
    assert last_turn(data)[0].sum(-1).tolist() == [1.0, -2.0]


def rlla_like(data_source, solution_str, ground_truth, extra_info=None):
    """verl's GDPO example scorer's shape: it needs extra_info["experiment_name"] and returns its components."""
    if "qwen" not in extra_info["experiment_name"]:
        raise NotImplementedError(extra_info["experiment_name"])
    return {"score": 1.5, "accuracy_reward": 1.0, "format_reward": 0.5}


def test_gdpo_manager_is_naive_that_tells_the_scorer_the_experiment_name_and_its_components_become_columns():
    """reward.reward_manager.name=gdpo (verl's reward.reward_manager.name=gdpo): naive's scores and extras; the
    trainer's component_columns turns algorithm.gdpo_reward_keys' extras into float columns, a failed sample's
    (no extras) at reward_model.error_score, and names a key the scorer never returned."""
    from rlcore.config import compose
    from rlcore.reward.manager import GdpoRewardManager, component_columns
    from rlcore.trainer.setup import build_reward_fns

    cfg = compose(["recipe=tiny_cpu", "reward.reward_manager.name=gdpo", "trainer.experiment_name=qwen3_8b_gdpo",
                   "reward_model.score_workers=0"])
    manager, _ = build_reward_fns(cfg, build_char_tokenizer())
    assert isinstance(manager, GdpoRewardManager) and manager.experiment_name == "qwen3_8b_gdpo"
    manager.scorer.compute_score = rlla_like  # scored in the controller (score_workers=0)
    scores, extras = manager(batch([3, 4]))
    assert scores.sum(-1).tolist() == [1.5, 1.5]
    assert extras == {"accuracy_reward": [1.0, 1.0], "format_reward": [0.5, 0.5]}
    columns = component_columns({"accuracy_reward": [1.0, None], "format_reward": [0.5, None]}, ["format_reward", "accuracy_reward"], -1.0)
    assert {k: v.tolist() for k, v in columns.items()} == {"format_reward": [0.5, -1.0], "accuracy_reward": [1.0, -1.0]}
    with pytest.raises(ValueError, match="names accuracy, which the reward function did not return"):
        component_columns(extras, ["accuracy"], 0.0)
