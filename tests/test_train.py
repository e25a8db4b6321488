import pytest

from rlcore.config import ConfigError, compose
from rlcore.train import check_config


def test_schema_and_runtime_problems_are_reported_together():
    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.ppo_mini_batch_size=7", "algorithm.adv_estimator=foo",
                   "actor_rollout_ref.actor.loss_agg_mode=token-sum"])
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    text = str(err.value)
    assert "ppo_mini_batch_size=7 does not divide data.train_batch_size=32" in text
    valid = text.split("algorithm.adv_estimator='foo' is not a registered advantage estimator; valid: ")[1].splitlines()[0]
    builtin = {"gae", "gpg", "grpo", "grpo_passk", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"}
    assert builtin <= set(valid.split(", "))  # (plus any a test registered from a file in this process)
    assert "loss_agg_mode" in text and "token-mean" in text


def test_valid_recipe_yields_the_batch_plan():
    plan = check_config(compose(["recipe=tiny_cpu"]))
    assert (plan.samples_per_step, plan.mini_batches_per_step, plan.micro_batches_per_mini_batch_per_rank) == (256, 1, 1)


def test_a_missing_critic_model_is_reported_before_ray_starts(tmp_path):
    cfg = compose(["recipe=tiny_cpu_ppo", f"critic.model.path={tmp_path}/no_model"])
    with pytest.raises(ConfigError, match=r"critic.model.path='.*no_model': no config.json"):
        check_config(cfg)
