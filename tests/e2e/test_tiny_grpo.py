"""The tiny recipe through Ray, the controller and 2 FSDP2 ranks: metrics, checkpoints and exact resume."""

import json
import math
import os

import pytest
import ray
import torch
from e2e_utils import KEEP_EVERY_STEP, assert_no_workers_left, assert_repeated_bit_for_bit, assert_same_steps, resume_overrides, tiny_cfg
from transformers import AutoModelForCausalLM

from rlcore.plan.run_plan import plan_run
from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)


def read_jsonl_file(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_jsonl(run_dir):
    return read_jsonl_file(os.path.join(run_dir, "metrics.jsonl"))


def read_metrics(run_dir):
    return [row for row in read_jsonl(run_dir) if "val_generations" not in row]


CUSTOM_REWARD = """
def my_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.25 if data_source == "tiny_add" else -1.0
"""


def test_two_steps_log_finite_verl_metrics_and_save_hf_checkpoint(tiny_model_dir, tiny_task_dir, tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(CUSTOM_REWARD)
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=2",
                   "trainer.test_freq=2", "data.val_max_samples=16",
                   f"reward.custom_reward_function.path={reward_file}", "reward.custom_reward_function.name=my_score",
                   "trainer.log_val_generations=2",
                   f"trainer.rollout_data_dir={tmp_path}/rollouts", f"trainer.validation_data_dir={tmp_path}/val_generations",
                   # exercise the between-phase offload path of actor (params + optimizer) and reference
                   "actor_rollout_ref.actor.fsdp_config.param_offload=True", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
                   "actor_rollout_ref.ref.fsdp_config.param_offload=True",
                   # 16 samples per rank through 8 KV slots: groups queue and join as slots free up
                   "actor_rollout_ref.rollout.max_num_seqs=8",
                   "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]")  # the HF model beside the checkpoint
    threads = torch.get_num_threads()
    final = run(cfg, str(tmp_path / "run"))
    assert final["rollout/kv_slots"] == 8 and final["rollout/prefills"] >= 2 and final["rollout/peak_running"] == 8
    assert_no_workers_left()
    assert torch.get_num_threads() == threads  # the controller's one thread was for the run only
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]  # val before train, then two steps
    generations = [r for r in read_jsonl(tmp_path / "run") if "val_generations" in r]
    assert len(generations) == 2 and len(generations[0]["val_generations"]) == 2
    prompt, response, score = generations[0]["val_generations"][0]
    assert prompt.startswith("<|user|>") and prompt.endswith("=<|assistant|>") and score == 0.25
    for key in ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac",
                "response_length/mean", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref",
                "timing_s/adv", "timing_s/update_actor", "timing_s/step", "perf/throughput", "val-core/tiny_add/reward/mean@1"):
        assert key in final and math.isfinite(final[key]), key
    # The user's reward function scored every sample (train and validation), not the built-in scorer.
    assert final["critic/score/mean"] == 0.25 and final["val-core/tiny_add/reward/mean@1"] == 0.25
    assert final["actor/lr"] > 0
    # verl's generation dumps: every training sample of a step (8 prompts x rollout.n=4), every validation sample
    rollouts = read_jsonl_file(tmp_path / "rollouts" / "2.jsonl")
    assert len(rollouts) == 32 and {r["score"] for r in rollouts} == {0.25} and {r["step"] for r in rollouts} == {2}
    assert sorted(os.listdir(tmp_path / "rollouts")) == ["1.jsonl", "2.jsonl"]
    val = read_jsonl_file(tmp_path / "val_generations" / "0.jsonl")
    assert len(val) == 16 and sorted(os.listdir(tmp_path / "val_generations")) == ["0.jsonl", "2.jsonl"]
    assert set(val[0]) == {"input", "output", "gts", "score", "step", "pred"} and val[0]["pred"] == val[0]["output"].strip()
    assert val[0]["input"] == prompt and int(val[0]["gts"]) == sum(map(int, prompt[len("<|user|>"):-len("=<|assistant|>")].split("+")))
    # rlcore-plan's estimate for this run against the measured peak RSS of the busiest rank (CPU: the process)
    plan, _ = plan_run(cfg)
    estimate = max(plan.planned_peaks.values())
    assert 0.5 < final["perf/max_memory_allocated_gb"] / estimate < 2, (final["perf/max_memory_allocated_gb"], estimate)
    hf_dir = tmp_path / "ckpt" / "global_step_2" / "actor" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True)
    assert model.config.num_hidden_layers == 2
    # The utilisation report: its per-step inputs, the per-rank detail, and what the end of the run wrote.
    run_dir = tmp_path / "run"
    assert {"perf.json", "ranks.jsonl", "report.txt", "plots.png"} <= set(os.listdir(run_dir))
    # the step report's memory plan is the run plan's, handed to the trainer (not derived again)
    with open(run_dir / "perf.json") as f:
        planned = json.load(f)["memory_plan"]
    assert planned == {"generate": plan.planned_peaks["rollout"], "update_actor": plan.planned_peaks["actor update"],
                       "ref": plan.planned_peaks["reference log-probs"]}
    ranks = read_jsonl_file(run_dir / "ranks.jsonl")
    assert [r["step"] for r in ranks] == [1, 2]
    assert set(ranks[1]["phases"]) == {"gen", "old_log_prob", "ref", "update_actor", "testing", "save_checkpoint"}
    assert all(len(p["busy_s"]) == 2 and min(p["busy_s"]) > 0 for p in ranks[1]["phases"].values())
    shares = [final[f"perf/{k}_share"] for k in ("device_busy", "wait_slowest", "dispatch", "controller")]
    assert all(0 <= x <= 1 for x in shares) and sum(shares) == pytest.approx(1.0) and final["perf/device_busy_share"] > 0.3
    assert 0 < final["perf/mfu/update_actor"] < 1 and 0 < final["perf/mfu/gen"] < 1
    report = (run_dir / "report.txt").read_text()
    assert report.startswith(f"utilisation report: {run_dir} (steps 1-2") and "update actor" in report and "rank 1" in report
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "ckpt").iterdir())


@pytest.mark.own_ray_cluster
def test_an_exactly_on_policy_step_skips_the_old_log_prob_pass(tiny_model_dir, tiny_task_dir, tmp_path):
    # one mini-batch (8 prompts) and one epoch; the KL loss keeps the reference pass on
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=1", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    final = run(cfg, str(tmp_path / "run"))
    assert not ray.is_initialized()  # a run without a cluster to join starts its own, and shuts it down
    assert "timing_s/old_log_prob" not in final and "timing_s/ref" in final
    assert final["actor/ppo_kl"] == 0.0 and final["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert 0 < final["actor/entropy"] < math.log(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)


@pytest.mark.numerics
def test_resume_continues_exactly_where_the_checkpoint_left_off(tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch):
    # Prompts drawn by a curriculum sampler (data.sampler, tests/data/curriculum_sampler.py): 16 prompts are 2 steps
    # an epoch, so step 3 opens an epoch ordered by the scores of steps 1-2, which the resumed run only has if the
    # sampler's state travelled in the checkpoint. The reward differs by prompt (a random tiny model's answers all
    # score 0), so the scores do order the prompts.
    sampler = os.path.join(os.path.dirname(__file__), "..", "data", "curriculum_sampler.py")
    reward = tmp_path / "by_answer.py"
    reward.write_text("def by_answer(data_source, solution_str, ground_truth, extra_info=None):\n    return int(ground_truth) % 3 / 2\n")
    common = ("trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.total_training_steps=3", "data.train_max_samples=16",
              f"data.sampler.class_path={sampler}", "data.sampler.class_name=HardestFirstSampler",
              f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=by_answer",
              "actor_rollout_ref.rollout.seed=5", "actor_rollout_ref.rollout.full_determinism=True")
    monkeypatch.setenv("RLCORE_TEST_SAMPLER_LOG", str(tmp_path / "draws.jsonl"))
    run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "a", *KEEP_EVERY_STEP, *common), str(tmp_path / "a"))
    draws = read_jsonl_file(tmp_path / "draws.jsonl")
    assert [d["epoch"] for d in draws] == [0, 0, 1] and all(len(d["rows"]) == 8 * 4 for d in draws)  # 8 prompts x n=4
    assert sorted(set(draws[0]["rows"]) | set(draws[1]["rows"])) == list(range(16))  # epoch 0: every prompt once
    assert draws[0]["order"] == list(range(16)) and draws[2]["order"] != draws[0]["order"]  # the scores reordered epoch 1
    assert set(draws[2]["rows"]) == set(draws[2]["order"][:8])  # step 3 drew epoch 1's 8 hardest prompts
    run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "b", *resume_overrides(tmp_path / "a" / "ckpt", 1), *common), str(tmp_path / "b"))
    assert read_jsonl_file(tmp_path / "draws.jsonl")[3:] == draws[1:]  # the resumed run drew steps 2 and 3 alike
    # Same data, same sampling RNG, same weights and optimizer state: steps 2 and 3 are the same steps.
    assert_same_steps(read_metrics(tmp_path / "b"), read_metrics(tmp_path / "a"),
                      ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"), first=2)
    # rollout.seed and full_determinism (verl 0.9): a second run from scratch with the same seeds (checkpointing nothing)
    # repeats every step's metrics bit for bit
    run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / "c", *common, "trainer.save_freq=-1"), str(tmp_path / "c"))
    assert_repeated_bit_for_bit(read_metrics(tmp_path / "c"), read_metrics(tmp_path / "a"))
