"""A worker process killed mid-run: the controller rebuilds the workers and resumes from the run's checkpoint."""

import json

import pytest
from e2e_utils import signalling_scorer, tiny_cfg

from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

@pytest.mark.slow
def test_killed_worker_is_replaced_and_training_resumes_from_checkpoint(tiny_model_dir, tiny_task_dir, tmp_path, capsys):
    samples_per_step, val_samples = 8 * 4, 8  # train_batch_size x rollout.n in tiny_cfg; data.val_max_samples
    # SIGKILL, no cleanup (like a segfault or the OOM killer), at the first sample scored in step 3.
    reward_file = signalling_scorer(tmp_path, "killer.py", at=val_samples + 2 * samples_per_step + 1, sig="SIGKILL")
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=4", "trainer.save_freq=2",
                   "trainer.test_freq=-1", "data.val_max_samples=8", "trainer.max_worker_restarts=1",
                   f"reward.custom_reward_function.path={reward_file}", "reward_model.score_workers=0")  # one process counts the calls
    final = run(cfg, str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "a worker process died at global step 3" in out and "restarting the workers from" in out
    assert "global_step_2" in out  # resumed from the checkpoint written before the crash
    steps = [json.loads(line)["step"] for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]  # step 3 failed before logging, then ran again; nothing else repeated
    assert final["training/global_step"] == 4
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "4"


def test_without_restarts_a_dead_worker_stops_with_a_resume_hint(tiny_model_dir, tiny_task_dir, tmp_path):
    reward_file = signalling_scorer(tmp_path, "killer.py", at=1, sig="SIGKILL")
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=2", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "trainer.max_worker_restarts=0", f"reward.custom_reward_function.path={reward_file}",
                   "reward_model.score_workers=0")  # one process counts the calls
    with pytest.raises(SystemExit, match=r"(?s)worker process died at global step 1.*No checkpoint was written yet.*max_worker_restarts"):
        run(cfg, str(tmp_path / "run"))


@pytest.mark.slow
def test_split_pools_a_killed_rollout_worker_restarts_from_the_checkpoint(tiny_model_dir, tiny_task_dir, tmp_path, capsys):
    """Split pools: the rollout rank is SIGKILLed while step 3's samples are scored; the sync after step 3 fails at
    once (not after a collective's timeout), every worker is rebuilt and the run resumes from global_step_2, whose
    checkpoint holds the rollout's RNG and the parameter version. Staleness 0 keeps the scorer's call count exact."""
    samples_per_step, val_samples = 8 * 4, 8
    reward_file = signalling_scorer(tmp_path, "killer.py", at=val_samples + 2 * samples_per_step + 1, sig="SIGKILL", worker="RolloutWorker")
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=4", "trainer.save_freq=2",
                   "trainer.test_freq=-1", "data.val_max_samples=8", "trainer.max_worker_restarts=1",
                   f"reward.custom_reward_function.path={reward_file}", "reward_model.score_workers=0",
                   "actor_rollout_ref.hybrid_engine=False", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=8", "async_training.staleness_threshold=0",
                   "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=False")
    final = run(cfg, str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "a worker process died at global step 3" in out and "global_step_2" in out
    steps = [json.loads(line)["step"] for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]
    assert final["training/global_step"] == 4 and final["async/param_version"] == 3
    assert (tmp_path / "ckpt" / "global_step_4" / "rollout" / "rng_rank0.pt").is_file()  # the rollout RNG beside the actor
