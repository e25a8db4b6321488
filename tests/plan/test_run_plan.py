"""rlcore/plan/run_plan.py: the facts the controller derives once, here whether each update is exactly on-policy (the
old-log-prob pass skipped), which the trainer reads from the plan."""

import pytest

from rlcore.config import compose
from rlcore.plan.run_plan import plan_run

ONE_UPDATE = ["recipe=tiny_cpu", "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
              "actor_rollout_ref.actor.ppo_epochs=1", "algorithm.use_kl_in_reward=False"]


@pytest.mark.parametrize("overrides, expected", [
    ([], True),
    (["actor_rollout_ref.actor.ppo_epochs=2"], False),  # the second epoch updates weights the rollout did not sample with
    (["actor_rollout_ref.actor.ppo_mini_batch_size=8"], False),  # so does the second mini-batch
    (["algorithm.use_kl_in_reward=True"], False),  # the reward's KL needs the old log-probs before the update
    (["actor_rollout_ref.actor.calculate_sum_pi_squared=True"], False),  # the optimal token baseline's sum pi^2
    (["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=0.5", "data.gen_batch_size=16"], False),
])
def test_the_plan_says_whether_each_update_is_on_policy(overrides, expected):
    plan, errors = plan_run(compose([*ONE_UPDATE, *overrides]))
    assert plan.on_policy is expected, errors
