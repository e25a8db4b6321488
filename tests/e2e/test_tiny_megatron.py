"""--config-name ppo_megatron_trainer end to end through Ray: the tiny recipe on megatron-core TP=2 (GRPO, with
checkpoint, HF export and exact resume) and PPO with a pipeline-parallel Megatron critic."""

import math

import pytest
from e2e_utils import KEEP_EVERY_STEP, assert_no_workers_left, assert_same_steps, resume_overrides, tiny_cfg
from test_tiny_grpo import read_metrics
from transformers import AutoModelForCausalLM

from rlcore.config.validate import diagnose
from rlcore.plan import memory_plan
from rlcore.train import run

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

MEGATRON = ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",)
COMMON = ("trainer.val_before_train=False", "trainer.test_freq=-1")


def test_grpo_on_megatron_tp2_trains_saves_an_hf_model_and_resumes_exactly(tiny_model_dir, tiny_task_dir, tmp_path):
    def cfg(name, *extra):
        return tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path / name, *MEGATRON, *COMMON, "trainer.total_training_steps=3",
                        *extra, config_name="ppo_megatron_trainer")

    straight = run(cfg("a", *KEEP_EVERY_STEP), str(tmp_path / "a"))
    assert_no_workers_left()
    for key in ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "timing_s/update_actor"):
        assert math.isfinite(straight[key]), key
    run(cfg("b", *resume_overrides(tmp_path / "a" / "ckpt", 1), "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"),
        str(tmp_path / "b"))
    assert_same_steps(read_metrics(tmp_path / "b"), read_metrics(tmp_path / "a"),
                      ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"), first=2)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "ckpt" / "global_step_3" / "actor" / "huggingface", local_files_only=True)
    assert hf.config.num_hidden_layers == 2
    # rlcore-plan's Megatron estimate against the measured peak of the busiest rank (CPU: the process's RSS)
    plan, _ = diagnose(cfg("a"))
    estimate = max(role.peak for role in memory_plan(cfg("a"), plan).roles)
    print(f"peak memory per rank: measured {straight['perf/max_memory_allocated_gb']:.3f} GiB, rlcore-plan {estimate:.3f} GiB")
    assert 0.5 < straight["perf/max_memory_allocated_gb"] / estimate < 2, (straight["perf/max_memory_allocated_gb"], estimate)


def test_ppo_with_a_pipeline_parallel_megatron_critic_and_a_lora_actor(tiny_model_dir, tiny_task_dir, tmp_path):
    # The actor trains LoRA adapters on megatron-core's TP2 linears (verl's model.lora.*): its reference is the base with
    # the adapters off, and the rollout receives merged weights (rlcore/engine/megatron/lora.py)
    lora = ("actor_rollout_ref.model.lora.rank=4", "actor_rollout_ref.model.lora.alpha=8", "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.optim.lr=1e-2")
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *MEGATRON, *COMMON, *lora, "trainer.total_training_steps=2",
                   "algorithm.adv_estimator=gae", f"critic.model.path={tiny_model_dir}", "critic.megatron.pipeline_model_parallel_size=2",
                   "critic.megatron.dtype=float32", "critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=8",
                   "critic.model.use_remove_padding=True", config_name="ppo_megatron_trainer")
    final = run(cfg, str(tmp_path / "run"))
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean", "actor/pg_loss"):
        assert math.isfinite(final[key]), key
    # step 2's policy has trained adapters: its KL to the base (the reference, adapters off) is no longer zero
    assert final["actor/kl_loss"] > 0 and "timing_s/ref" in final
