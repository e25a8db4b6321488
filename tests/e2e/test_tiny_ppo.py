"""PPO with a critic, ReMax, and user algorithms from a file: through Ray, the controller and 2 FSDP2 ranks."""

import math

import pytest
from e2e_utils import KEEP_EVERY_STEP, assert_no_workers_left, assert_same_steps, refuse_ray, resume_overrides, tiny_cfg
from test_tiny_grpo import read_metrics
from transformers import AutoModelForTokenClassification

from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

PPO = ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=16",
       "critic.optim.lr=1e-3")
COMMON = ("trainer.val_before_train=False", "trainer.test_freq=-1")


@pytest.mark.numerics
def test_ppo_with_a_colocated_critic_trains_saves_and_resumes_exactly(tiny_model_dir, tiny_task_dir, tmp_path):
    """Three steps saving each, then a second run resumed from step 1's checkpoint: steps 2 and 3 again, equal to
    the first run's, the critic's state included. Also the throughput path end to end: token-budget micro-batches
    for actor, old/ref log-probs and critic, packed sequences in both models (the recipe packs the actor's), balanced
    ranks (trainer.balance_batch), and the critic's parameters and optimizer offloaded between its phases."""
    def cfg(name, *extra):
        return tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / name, *PPO, *COMMON, "trainer.total_training_steps=3",
                        f"critic.model.path={tiny_model_dir}", "critic.model.fsdp_config.param_offload=True",
                        "critic.model.fsdp_config.optimizer_offload=True", "trainer.critic_warmup=1",
                        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40",
                        "critic.ppo_max_token_len_per_gpu=40", "critic.model.use_remove_padding=True",
                        "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]", *extra)

    final = run(cfg("a", *KEEP_EVERY_STEP), str(tmp_path / "a"))
    assert_no_workers_left()
    rows = read_metrics(tmp_path / "a")
    first = rows[0]
    assert "critic/vf_loss" in first and "actor/pg_loss" not in first  # critic_warmup=1: step 1 trains only the critic
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr",
                "critic/values/mean", "critic/vf_explained_var", "timing_s/values", "timing_s/update_critic", "actor/pg_loss",
                "actor/kl_loss", "global_seqlen/minmax_diff", "global_seqlen/balanced_max"):
        assert key in final and math.isfinite(final[key]), key
    assert final["critic/lr"] == pytest.approx(1e-3)
    assert final["global_seqlen/balanced_max"] <= final["global_seqlen/max"]
    # GAE with gamma = lam = 1: returns = advantages before whitening + values, so mean(returns) = mean(score
    # on the last token propagated back) is bounded by the scores.
    assert 0.0 <= final["critic/returns/mean"] <= 1.0
    critic_hf = tmp_path / "a" / "ckpt" / "global_step_2" / "critic" / "huggingface"
    critic = AutoModelForTokenClassification.from_pretrained(critic_hf, local_files_only=True)
    assert critic.config.num_labels == 1 and critic.score.weight.shape[0] == 1

    run(cfg("b", *resume_overrides(tmp_path / "a" / "ckpt", 1)), str(tmp_path / "b"))
    assert_same_steps(read_metrics(tmp_path / "b"), rows, ("critic/score/mean", "critic/values/mean", "critic/vf_loss", "critic/grad_norm",
                                                           "actor/pg_loss", "actor/grad_norm"), first=2)


@pytest.mark.own_ray_cluster  # 3 Ray CPUs
def test_critic_on_its_own_resource_pool(tiny_model_dir, tiny_task_dir, tmp_path):
    # 2 actor ranks + 1 critic rank on their own bundles: 3 Ray CPUs (logical; the machine has 2 cores).
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *PPO, *COMMON, "trainer.total_training_steps=1",
                   f"critic.model.path={tiny_model_dir}", "critic.enable_resource_pool=True", "critic.n_gpus_per_node=1",
                   "ray_kwargs.ray_init.num_cpus=3")
    final = run(cfg, str(tmp_path / "run"))
    assert math.isfinite(final["critic/vf_loss"]) and math.isfinite(final["actor/pg_loss"])


CUSTOM_ALGOS = """
import torch
from rlcore.algos import POLICY_LOSSES

@POLICY_LOSSES.register("scaled_pg")
def scaled_pg(old_log_prob, log_prob, advantages, response_mask, **_):
    zeros = torch.zeros_like(log_prob)
    stats = {"actor/pg_clipfrac": zeros, "actor/pg_clipfrac_lower": zeros, "actor/ppo_kl": zeros,
             "actor/user_loss_ran": torch.ones_like(log_prob)}
    return -0.5 * advantages * log_prob, stats
"""


def test_remax_with_a_user_policy_loss_from_a_file(tiny_model_dir, tiny_task_dir, tmp_path):
    algos = tmp_path / "my_algos.py"
    algos.write_text(CUSTOM_ALGOS)
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *COMMON, "trainer.total_training_steps=1",
                   "algorithm.adv_estimator=remax", f"custom_algorithms.path={algos}",
                   "actor_rollout_ref.actor.policy_loss.loss_mode=scaled_pg")
    final = run(cfg, str(tmp_path / "run"))
    assert final["actor/user_loss_ran"] == pytest.approx(1.0)  # the file's loss ran on the workers
    assert final["timing_s/gen_max"] > 0  # the controller generated the greedy baseline


def test_unknown_user_algorithm_name_lists_the_registered_ones(tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch):
    from rlcore.config import ConfigError

    refuse_ray(monkeypatch)  # rejected before Ray starts

    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.actor.policy_loss.loss_mode=my_missing_loss",
                   "trainer.total_training_steps=1")
    with pytest.raises(ConfigError, match="loss_mode='my_missing_loss' is not a registered policy loss; valid: .*clip_cov"):
        run(cfg, str(tmp_path / "run"))
