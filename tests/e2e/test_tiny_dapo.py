"""DAPO's dynamic sampling end to end through Ray: groups whose samples all score the same never reach the update,
and a step that cannot be filled stops the run with the reason."""

import pytest
from e2e_utils import assert_no_workers_left, tiny_cfg

from rlcore.config import compose
from rlcore.config.validate import diagnose
from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

# Prompts whose sum is even score 1.0 for every sample (an all-equal group); the others score the parity of the
# response's length, which differs within most groups of a random model.
REWARD = """
def parity_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if int(ground_truth) % 2 == 0 else float(len(solution_str) % 2)
"""
# The advantage estimator runs on the controller after filtering: it refuses any group that should have been dropped.
ALGOS = """
import numpy as np
from rlcore.algos import ADV_ESTIMATORS
from rlcore.algos.advantages import grpo_outcome_advantage

@ADV_ESTIMATORS.register("checked_grpo")
def checked_grpo(token_level_rewards, response_mask, index, **kw):
    scores = token_level_rewards.sum(-1).numpy()
    for uid in np.unique(index):
        group = scores[index == uid]
        assert len(group) == 4 and np.std(group) > 0, f"an all-equal group reached the update: {group}"
    return grpo_outcome_advantage(token_level_rewards, response_mask, index, **kw)
"""
COMMON = ("trainer.val_before_train=False", "trainer.test_freq=-1", "algorithm.filter_groups.enable=True",
          "algorithm.filter_groups.metric=seq_reward", "data.gen_batch_size=8")


def reward(tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    return (f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.custom_reward_function.name=parity_score")


def test_only_groups_with_differing_scores_reach_the_update(tiny_model_dir, tiny_task_dir, tmp_path):
    (tmp_path / "algos.py").write_text(ALGOS)
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *COMMON, *reward(tmp_path), "trainer.total_training_steps=2",
                   "algorithm.filter_groups.max_num_gen_batches=20", f"custom_algorithms.path={tmp_path / 'algos.py'}",
                   "algorithm.adv_estimator=checked_grpo")
    final = run(cfg, str(tmp_path / "run"))
    # About half the prompts have an even sum: each 8-prompt generation batch keeps ~4 groups, so a step of 8
    # prompts takes more than one batch, and every kept group passed the estimator's check.
    assert final["train/num_gen_batches"] >= 2 and 0 < final["train/kept_group_ratio"] < 1
    assert final["timing_s/gen"] > 0 and final["actor/pg_loss"] == final["actor/pg_loss"]


def test_a_step_that_cannot_be_filled_stops_with_the_reason(tiny_model_dir, tiny_task_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *COMMON, *reward(tmp_path), "trainer.total_training_steps=1",
                   "algorithm.filter_groups.max_num_gen_batches=1")
    with pytest.raises(RuntimeError, match=r"1 generation batches \(max_num_gen_batches=1\) kept \d of the 8 prompts"):
        run(cfg, str(tmp_path / "run"))
    assert_no_workers_left()


def test_overlong_buffer_in_the_dapo_recipe_form_equals_the_reward_kwargs_form(tiny_model_dir):
    from rlcore.trainer.setup import build_reward_fns

    recipe = compose(["recipe=tiny_cpu_dapo", f"actor_rollout_ref.model.path={tiny_model_dir}"])
    assert diagnose(recipe)[1] == []
    kwargs_form = compose(["recipe=tiny_cpu_dapo", f"actor_rollout_ref.model.path={tiny_model_dir}",
                           "reward_model.overlong_buffer.enable=False", "+reward.reward_kwargs.max_resp_len=5",
                           "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
                           "+reward.reward_kwargs.overlong_buffer_cfg.len=1",
                           "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                           "+reward.reward_kwargs.overlong_buffer_cfg.log=False"])
    a, _ = build_reward_fns(recipe, tokenizer=None)
    b, _ = build_reward_fns(kwargs_form, tokenizer=None)
    assert (a.max_resp_len, a.overlong) == (b.max_resp_len, b.overlong) == (5, {"enable": True, "len": 1, "penalty_factor": 1.0, "log": False})
    assert a.shape_score(1.0, 5, {}) == 0.0 and a.shape_score(1.0, 4, {}) == 1.0  # only max-length responses pay
