"""On-policy distillation against GRPO on the tiny task, from the same weak student (docs/distillation.md).

1. The teacher: the demo's SFT warm-start (`make train`'s, 0.55M params) after --teacher-steps of GRPO.
2. The student (--student): `sft`, that same SFT warm-start (the teacher's own starting point: a weak student the
   teacher's function fits), or `small`, the SFT warm-start of a narrower model (hidden 64 instead of 128, 0.14M
   params), built by the same recipe (rlcore.cli.prepare_tiny, stopped at 25% greedy accuracy on training problems).
3. From that student, --steps of GRPO (the tiny_cpu recipe) and --steps of on-policy distillation from the teacher
   (the same recipe and samples per step; loss_mode k1 as a policy-gradient reward, no task reward: Thinking
   Machines' form), each validated greedily on the 500 held-out problems every --eval-every steps.

Prints both curves and writes them with the run's facts to --out (JSON). Minutes on 2 cores:

    .venv/bin/python bench/distill_demo.py                     # teacher 800 steps, students 150 each
    .venv/bin/python bench/distill_demo.py --student small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from rlcore.cli.prepare_tiny import SETTINGS, prepare
from rlcore.config import compose
from rlcore.train import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(SETTINGS, hidden_size=64, intermediate_size=256)  # the student: the same task, a narrower model
VAL = "val-core/tiny_add/reward/mean@1"


def train(assets: str, model: str, out: str, steps: int, eval_every: int, *extra: str) -> tuple[list, list]:
    """A tiny_cpu run from `model`: (held-out accuracy [(step, acc)], per-step rows)."""
    shutil.rmtree(out, ignore_errors=True)
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={model}", f"data.train_files={assets}/data/train.parquet",
                   f"data.val_files={assets}/data/test.parquet", f"trainer.default_local_dir={out}/ckpt",
                   f"trainer.total_training_steps={steps}", f"trainer.test_freq={eval_every}", "trainer.logger=[jsonl]",
                   "trainer.verbosity=short", *extra])
    run(cfg, out)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [(r["step"], r[VAL]) for r in rows if VAL in r], [r for r in rows if "critic/score/mean" in r]


def build_teacher(assets: str, work: str, steps: int) -> tuple[str, float]:
    """The demo's SFT model after `steps` of GRPO, exported as an HF directory; its held-out accuracy."""
    teacher = os.path.join(work, "teacher")
    stamp = os.path.join(teacher, "demo.json")
    if os.path.isfile(stamp) and json.load(open(stamp))["steps"] == steps:
        return teacher, json.load(open(stamp))["val"]
    val, _ = train(assets, f"{assets}/sft_model", os.path.join(work, "teacher_run"), steps, steps, f"trainer.save_freq={steps}",
                   "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]")
    shutil.rmtree(teacher, ignore_errors=True)
    shutil.copytree(os.path.join(work, "teacher_run", "ckpt", f"global_step_{steps}", "actor", "huggingface"), teacher)
    json.dump({"steps": steps, "val": val[-1][1]}, open(stamp, "w"))
    return teacher, val[-1][1]


def first_step_reaching(curve: list, target: float):
    return next((step for step, acc in curve if acc >= target), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher-steps", type=int, default=800)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--student", choices=("sft", "small"), default="sft")
    p.add_argument("--work", default=os.path.join(REPO, ".cache", "distill_demo"))
    p.add_argument("--out", default=None, help="default: bench/distill_demo_<student>.json")
    args = p.parse_args()
    start = time.perf_counter()
    assets = prepare(os.path.join(REPO, ".cache", "tiny_cpu"))
    assets = os.path.dirname(assets)
    teacher, teacher_val = build_teacher(assets, args.work, args.teacher_steps)
    student_assets = assets if args.student == "sft" else os.path.dirname(prepare(os.path.join(REPO, ".cache", "tiny_cpu_small"), SMALL))
    student = f"{student_assets}/sft_model"
    grpo, grpo_rows = train(student_assets, student, os.path.join(args.work, f"grpo_{args.student}"), args.steps, args.eval_every)
    opd, opd_rows = train(student_assets, student, os.path.join(args.work, f"opd_{args.student}"), args.steps, args.eval_every,
                          "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={teacher}",
                          "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=True",
                          "distillation.distillation_loss.use_task_rewards=False")
    target = grpo[-1][1]
    share = [r["timing_s/teacher"] / r["timing_s/step"] for r in opd_rows]
    result = {
        "teacher": {"steps": args.teacher_steps, "val": teacher_val}, "student": args.student,
        "grpo": grpo, "opd": opd, "grpo_final": target,
        "opd_steps_to_grpo_final": first_step_reaching(opd, target),
        "teacher_phase_share_of_step": sum(share) / len(share),
        "step_s": {"grpo": sum(r["timing_s/step"] for r in grpo_rows) / len(grpo_rows),
                   "opd": sum(r["timing_s/step"] for r in opd_rows) / len(opd_rows)},
        "seconds": time.perf_counter() - start,
    }
    json.dump(result, open(args.out or os.path.join(REPO, "bench", f"distill_demo_{args.student}.json"), "w"), indent=1)
    print(f"teacher: {args.teacher_steps} GRPO steps from the demo's SFT model, held-out accuracy {teacher_val:.3f}")
    print("step  GRPO   OPD")
    for (step, g), (_, o) in zip(grpo, opd):
        print(f"{step:4d}  {g:.3f}  {o:.3f}")
    print(f"OPD reaches GRPO's final {target:.3f} at step {result['opd_steps_to_grpo_final']}; the teacher's phase is "
          f"{100 * result['teacher_phase_share_of_step']:.0f}% of an OPD step ({result['step_s']['opd']:.2f} s vs GRPO's "
          f"{result['step_s']['grpo']:.2f} s); {result['seconds']:.0f} s in all")


if __name__ == "__main__":
    main()
