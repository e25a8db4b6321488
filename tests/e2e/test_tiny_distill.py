"""On-policy distillation through the whole stack with verl's keys: the controller, 2 FSDP2 student ranks and a
teacher group colocated on the same devices (a wider model), the teacher's phase in every step, and the student's
loss the teacher's per-token reverse KL as a policy-gradient reward (Thinking Machines' form, verl's k1)."""

import math
from pathlib import Path

import pytest
from conftest import build_tiny_model_dir
from e2e_utils import tiny_cfg
from test_tiny_grpo import read_metrics

from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)
D = "distillation"


def test_a_run_distils_from_a_colocated_teacher_with_verls_keys(tiny_model_dir, tiny_task_dir, tmp_path):
    teacher = build_tiny_model_dir(str(tmp_path / "teacher"), seed=7, hidden=96)
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "run", "trainer.total_training_steps=2", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", f"{D}.enabled=True", f"{D}.teacher_models.teacher_model.model_path={teacher}",
                   f"{D}.distillation_loss.loss_mode=k1", f"{D}.distillation_loss.use_policy_gradient=True",
                   f"{D}.distillation_loss.use_task_rewards=False", "actor_rollout_ref.actor.optim.lr=1e-3")
    final = run(cfg, str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2
    for key in ("actor/distillation/loss", "actor/distillation/abs_loss", "actor/distillation/loss_min", "actor/distillation/loss_max",
                "actor/distillation/pg_clipfrac", "timing_s/teacher", "distillation/teacher_model/rollout_reverse_kl"):
        assert key in final and math.isfinite(final[key]), key
    # A random wider teacher disagrees with the student: its per-token reverse KL is far from zero, and the student's
    # own k1 estimate of it (the loss's advantage, before clamping) has the spread of a real signal.
    assert final["distillation/teacher_model/rollout_reverse_kl"] > 0.01
    assert final["actor/distillation/loss_min"] < 0 < final["actor/distillation/loss_max"]
    assert final["actor/distillation/abs_loss"] > 0.1
    assert all(r["timing_s/teacher"] < r["timing_s/step"] for r in rows)


@pytest.mark.demo
@pytest.mark.own_ray_cluster  # bench/distill_demo.py's runs start their own clusters, as a user's do
def test_distillation_from_a_grpo_teacher_reaches_grpos_accuracy_in_fewer_steps(tmp_path):
    """bench/distill_demo.py: a weak small student, GRPO alone against on-policy distillation from the demo's model
    after GRPO (docs/distillation.md has both curves of one run)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "demo.json"
    subprocess.run([sys.executable, "bench/distill_demo.py", "--out", str(out)], check=True, cwd=Path(__file__).resolve().parents[2])
    result = json.loads(out.read_text())
    steps = [step for step, _ in result["grpo"]]
    assert result["opd_steps_to_grpo_final"] is not None and result["opd_steps_to_grpo_final"] < steps[-1]
    assert result["opd"][-1][1] > result["grpo"][-1][1]
