"""Shared e2e set-up: the tiny recipe pointed at the test fixtures, small enough for CI."""

from rlcore.config import compose


def tiny_cfg(model_dir, task_dir, out_dir, *overrides, config_name="ppo_trainer"):
    return compose([
        "recipe=tiny_cpu",
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={task_dir}/train.parquet",
        f"data.val_files={task_dir}/test.parquet",
        f"trainer.default_local_dir={out_dir}/ckpt",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        *overrides,
    ], config_name=config_name)


# A compute_score that counts its calls in a file (with reward_model.score_workers=0 one process scores them all)
# and, at call `at`, sends `sig` to the newest process of worker class `worker`, writing its pid to `pid_file`.
SIGNALLING_SCORER = """
import os, signal, psutil
COUNT = {count_file!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    n = int(open(COUNT).read()) + 1 if os.path.exists(COUNT) else 1
    open(COUNT, "w").write(str(n))
    if n == {at}:
        ranks = sorted((p for p in psutil.process_iter(["cmdline"]) if any({worker!r} in part for part in (p.info["cmdline"] or []))),
                       key=lambda p: p.create_time())
        open({pid_file!r}, "w").write(str(ranks[-1].pid))
        ranks[-1].send_signal(signal.{sig})
    return 0.0
"""


def signalling_scorer(tmp_path, name: str, at: int, sig: str, worker: str = "ActorRolloutRefWorker") -> str:
    """Writes SIGNALLING_SCORER to tmp_path/name (counting in tmp_path/count, the pid in tmp_path/pid); returns its path."""
    path = tmp_path / name
    path.write_text(SIGNALLING_SCORER.format(count_file=str(tmp_path / "count"), at=at, pid_file=str(tmp_path / "pid"), sig=sig,
                                             worker=worker))
    return str(path)
