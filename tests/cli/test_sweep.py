"""The multirun summary: job rows from each job's summary.json, failures listed, and a real 2-job sweep."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from rlcore.cli.sweep import SweepSummary, format_summary, write_job_summary

REPO = Path(__file__).resolve().parents[2]


def test_job_summary_and_table(tmp_path, capsys):
    ok_dir, bad_dir = tmp_path / "0", tmp_path / "1"
    ok_dir.mkdir(), bad_dir.mkdir()
    summary = write_job_summary(str(ok_dir), {"critic/score/mean": 0.375, "timing_s/step": 0.25}, steps=2, wall_s=41.6)
    assert summary == {"final_reward": 0.375, "steps_per_s": 4.0, "steps": 2, "wall_s": 41.6}
    assert json.loads((ok_dir / "summary.json").read_text()) == summary
    callback = SweepSummary()
    callback.on_multirun_start(config=None)
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(ok_dir)}}})
    callback.on_job_end(None, JobReturn(overrides=["algorithm.kl_ctrl.kl_coef=0.0"], working_dir=str(tmp_path),
                                        hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED))
    callback.on_job_end(None, JobReturn(overrides=["algorithm.kl_ctrl.kl_coef=0.01"], working_dir=str(bad_dir),
                                        status=JobStatus.FAILED, _return_value=RuntimeError("worker died\nmore")))
    callback.on_multirun_end(config=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rlcore sweep summary (2 jobs")
    assert lines[1].split() == ["#", "overrides", "final", "reward", "steps/s", "wall", "s"]
    assert lines[2].split() == ["0", "algorithm.kl_ctrl.kl_coef=0.0", "0.3750", "4.00", "42"]
    assert lines[3].split() == ["1", "algorithm.kl_ctrl.kl_coef=0.01", "failed:", "worker", "died"]


def test_missing_numbers_render_as_nan():
    table = format_summary([("a=1", {"final_reward": float("nan"), "steps_per_s": float("nan"), "wall_s": 3}, "ok")])
    assert table.splitlines()[2].split() == ["0", "a=1", "nan", "nan", "3"]


@pytest.mark.slow
def test_multirun_runs_each_job_in_its_own_directory_and_prints_the_table(tiny_model_dir, tiny_task_dir, tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable, "-m", "rlcore.train", "-m", "recipe=tiny_cpu", "actor_rollout_ref.actor.optim.lr=1e-4,3e-4",  # docs/recipes.md's sweep
        "trainer.total_training_steps=2", f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={tiny_task_dir}/train.parquet", f"data.val_files={tiny_task_dir}/test.parquet",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path}/ckpt", f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    # A session of its own: every process the sweep starts (its Ray clusters' too) carries its session id, its pid.
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    for job in ("0", "1"):
        summary = json.loads((sweep_dir / job / "summary.json").read_text())
        assert summary["steps"] == 2 and 0 <= summary["final_reward"] <= 1 and summary["steps_per_s"] > 0
        assert (sweep_dir / job / "metrics.jsonl").is_file()  # each job logged into its own directory
    table = stdout[stdout.index("rlcore sweep summary"):].splitlines()
    assert table[0].startswith("rlcore sweep summary (2 jobs")
    assert "actor_rollout_ref.actor.optim.lr=0.0001 " in table[2] and "actor_rollout_ref.actor.optim.lr=0.0003 " in table[3]
    assert [len(row.split()) for row in table[2:4]] == [len(table[2].split())] * 2  # numbers, not "failed"
    # each job started its own local Ray cluster and shut it down: two sessions, and no process of them left behind
    assert stdout.count("memory plan: rollout") == 2  # the doctor ran before each job's Ray start
    # A process killed as a job's cluster stopped is torn down by the kernel a moment later: gone within seconds,
    # not necessarily at the instant the sweep returns (seen once: a 'python' process still 'running').
    deadline = time.monotonic() + 30
    while (left := [p for p in psutil.process_iter() if alive_in_session(p, proc.pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], [(p.pid, p.info) for p in psutil.process_iter(["name", "cmdline"]) if p in left]


def alive_in_session(proc, sid: int) -> bool:
    """Whether `proc` runs in session `sid` (an exited one whose parent has not reaped it yet does not run)."""
    try:
        return os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):  # gone meanwhile
        return False
