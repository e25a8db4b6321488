"""Split pools (actor_rollout_ref.hybrid_engine=False) on the tiny task: 1 training rank + 1 rollout rank, the
rollout in a thread of the controller, weights streamed between the pools over a group of their own."""

import os

import pytest
import torch
from e2e_utils import assert_no_workers_left, tiny_cfg
from test_tiny_grpo import read_metrics

from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

SPLIT = ["actor_rollout_ref.hybrid_engine=False", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
         "trainer.logger=['jsonl']", "data.val_max_samples=32"]
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "response_length/mean", "actor/entropy")


@pytest.mark.own_ray_cluster  # 2 and 4 Ray CPUs: each rank computes with 2 threads in both runs
def test_staleness_zero_is_the_synchronous_trainer(tiny_model_dir, tiny_task_dir, tmp_path):
    """staleness_threshold=0, trigger_parameter_sync_step=1, partial_rollout=False: the same samples and the same
    losses as the hybrid engine from the same seed, step for step. Each rank computes with 2 threads in both runs
    (num_cpus: 2 for one rank, 4 for two), so the matmuls reduce in the same order."""
    common = ["trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.save_freq=-1", "data.val_max_samples=32",
              "trainer.logger=['jsonl']", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "s", *common, "ray_kwargs.ray_init.num_cpus=2"), str(tmp_path / "sync"))
    run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "a", *common, *SPLIT[:3], "ray_kwargs.ray_init.num_cpus=4",
                 "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
                 "async_training.partial_rollout=False"), str(tmp_path / "async"))
    sync, split = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [r["step"] for r in split] == [r["step"] for r in sync] == [0, 1, 2, 3]
    for a, s in zip(split[1:], sync[1:]):
        assert a["async/staleness_max"] == 0 and a["async/param_version"] == a["step"] - 1
        assert a["rollout/log_prob_abs_diff"] < 1e-5  # the streamed weights are the trainer's: same log-probs
        for key in COMPARED:
            assert a[key] == pytest.approx(s[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], s[key])
    assert split[-1]["val-core/tiny_add/reward/mean@1"] == sync[-1]["val-core/tiny_add/reward/mean@1"]


def test_one_step_off_bounds_staleness_and_syncs_in_constant_time(tiny_model_dir, tiny_task_dir, tmp_path):
    """staleness_threshold=1 with a sync every step (verl's one-step-off): the rollout runs one step ahead, no sample
    is more than one version old, the old policy is the rollout's log-probs (bypass), and a sync takes about the
    same time at every step. A checkpoint records the version; the run stops cleanly (no Ray left)."""
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *SPLIT, "trainer.total_training_steps=6", "trainer.test_freq=-1",
                   "trainer.save_freq=6", "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
                   "data.gen_batch_size=4", "async_training.require_batches=2")
    run(cfg, str(tmp_path / "run"))
    assert_no_workers_left()
    rows = read_metrics(tmp_path / "run")[1:]
    assert len(rows) == 6
    assert max(r["async/staleness_max"] for r in rows) == 1 and rows[0]["async/staleness_max"] == 0
    assert all(r["async/param_version"] == r["step"] - 1 for r in rows)  # synced after every step
    assert "timing_s/old_log_prob" not in rows[-1]  # bypass: the rollout's log-probs are the old policy
    sync_s = [r["async/weight_sync_s"] for r in rows[:-1]]
    assert max(sync_s[2:]) < 3 * max(sync_s[0], 0.05), sync_s  # does not grow with the step
    state = torch.load(os.path.join(tmp_path, "ckpt", "global_step_6", "data.pt"), weights_only=False)
    assert state["param_version"] == 5 and state["global_step"] == 6  # no sync after the last step


def test_megatron_weights_reach_the_rollout_pool(tiny_model_dir, tiny_task_dir, tmp_path):
    """A Megatron trainer as the source: its gathered TP/PP pieces, in HF names, streamed to the other pool; at
    staleness 0 the rollout's log-probs are the update's own."""
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *SPLIT, "trainer.total_training_steps=2", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                   "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
                   "async_training.partial_rollout=False", config_name="ppo_megatron_trainer")
    run(cfg, str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and all(r["rollout/log_prob_abs_diff"] < 1e-5 for r in rows), rows
    assert rows[0]["async/weight_sync_s"] > 0 and rows[0]["rollout/weights_synced"] > 0


def test_compute_prox_log_prob_recomputes_the_old_policy_and_corrects_with_is_weights(tiny_model_dir, tiny_task_dir, tmp_path):
    """Decoupled PPO: stale samples' old log-probs come from the trainer's weights (the proximal policy), and the
    rollout correction weighs proximal against behaviour (the rollout's log-probs) with token-level TIS."""
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *SPLIT, "trainer.total_training_steps=3", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "async_training.staleness_threshold=1",
                   "async_training.trigger_parameter_sync_step=1", "async_training.require_batches=2",
                   "async_training.compute_prox_log_prob=True", "algorithm.rollout_correction.rollout_is=token")
    run(cfg, str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    assert all("timing_s/old_log_prob" in r for r in rows)  # the proximal pass ran every step
    stale = [r for r in rows if r["async/staleness_max"] == 1]
    assert stale and all(r["rollout_corr/log_ppl_abs_diff"] > 0 for r in stale), rows  # behaviour != proximal there


def test_verl_0_9_colocate_async_carries_samples_across_steps_on_the_hybrid_workers(demo_assets, tmp_path):
    """trainer_mode=colocate_async through Ray: two hybrid ranks, each returning its share of the groups that finish
    first and carrying the rest on after the weight sync; the old-log-prob pass runs (the samples are stale); the
    run stops cleanly. The carried rows' parity is tests/rollout/test_partial_rollout.py, the joins and the bound
    tests/trainer/test_colocate_async.py, learning the demo in tests/e2e/test_tiny_learns.py. The demo's SFT model:
    its answers end at different lengths, so some samples are part-way when a step's groups have finished."""
    cfg = tiny_cfg(f"{demo_assets}/sft_model", f"{demo_assets}/data", tmp_path, "trainer.total_training_steps=3",
                   "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=['jsonl']",
                   "trainer.v1.trainer_mode=colocate_async")
    run(cfg, str(tmp_path / "run"))
    assert_no_workers_left()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/carried_rows"] > 0 and r["async/dropped_samples"] == 0 and "timing_s/old_log_prob" in r for r in rows)
    assert rows[0]["async/staleness_max"] == 0 and max(r["async/staleness_max"] for r in rows[1:]) >= 1
    assert max(r["async/partial_ratio"] for r in rows) > 0  # samples went on under the weights of a later step
    assert all(r["response_length/mean"] > 0 for r in rows)
