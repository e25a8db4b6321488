"""The model families users start RL from, each a tiny random config, through a whole GRPO step of the hybrid
worker: weight sync into the native rollout (tied heads included), sampling, old and reference log-probs, GRPO
advantages, the actor update, and a second sync that moves the rollout with the training weights.

After every sync the rollout's greedy tokens are the training model's own greedy continuation and their log-probs
equal the training forward's (fp32, 1e-5): a head that missed the sync, a tie broken in training, a norm left out
of a converter, or a RoPE scaling applied on one side only shows up here."""

import numpy as np
import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo, spawn_ranks
from grpo_step import N, family_cfg, greedy_matches_training, grpo_batch, prompts_batch
from transformers import AutoModelForCausalLM

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.plan.families import family_problems
from rlcore.models.random_init import TINY_FAMILIES, TINY_MOE, build_config, build_model_dir
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

HF_MODEL = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
pytestmark = pytest.mark.numerics  # compares floats across kernels: re-run under other CPU kernels (make test-numerics)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    tokenizer = build_char_tokenizer()
    return {name: build_model_dir(str(root / name), name, tokenizer) for name in TINY_FAMILIES}


def test_every_tiny_family_is_a_family_rlcore_accepts():
    tokenizer = build_char_tokenizer()
    for name in TINY_FAMILIES:
        assert family_problems(build_config(name, tokenizer).to_dict(), "fsdp2") == [], name
        assert name in TINY_MOE or family_problems(build_config(name, tokenizer).to_dict(), "megatron") == [], name


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_grpo_step_on_fsdp2_and_the_native_rollout(family, family_dirs, tiny_task_dir, tmp_path):
    init_gloo(0, 1, free_port())
    worker = ActorRolloutRefWorker(family_cfg(family_dirs[family], tiny_task_dir, tmp_path, HF_MODEL), 0, 1, "cpu")
    worker.init_model(total_steps=2)
    tied = worker.actor.hf_config.tie_word_embeddings
    if tied:  # one parameter, two names: the tie survived sharding, and the sync streams it once
        assert worker.actor.model.get_output_embeddings().weight is worker.actor.model.get_input_embeddings().weight
        assert "lm_head.weight" not in [name for name, _ in worker.actor.rollout_weights()]
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    before = greedy_matches_training(worker, prompts)

    sampled = worker.generate_sequences(prompts)
    responses = sampled.batch["responses"].view(-1, N, sampled.batch["responses"].shape[-1])
    assert any(len({tuple(r.tolist()) for r in group}) > 1 for group in responses)  # N samples of a prompt differ
    metrics = worker.update_actor(grpo_batch(sampled, worker))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0

    after = greedy_matches_training(worker, prompts)  # the second sync carries the updated weights (tied head too)
    moved = (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max()
    assert moved > 1e-3, f"{family}: the rollout did not follow the update"

    # Checkpoint and HF export of the trained weights: HF loads them (re-tying the head), and a fresh worker that
    # resumes from the checkpoint decodes exactly what this one does.
    worker.save_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight) == tied
    trained = dict(worker.actor.rollout_weights())
    for name, tensor in hf.state_dict().items():
        torch.testing.assert_close(tensor, trained[name if name in trained else "model.embed_tokens.weight"], atol=0, rtol=0)
    resumed = ActorRolloutRefWorker(family_cfg(family_dirs[family], tiny_task_dir, tmp_path / "resumed"), 0, 1, "cpu")
    resumed.init_model(total_steps=2)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    again = greedy_matches_training(resumed, prompts)
    torch.testing.assert_close(again.batch["rollout_log_probs"], after.batch["rollout_log_probs"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["tiny-qwen3", "tiny-llama3.2"])
def test_lora_on_a_tied_model_syncs_merged_weights(family, family_dirs, tiny_task_dir, tmp_path):
    """LoRA on every linear of a tied model: the sync sends merged weights (the tied head once, frozen), and after
    an update the rollout follows the adapters."""
    init_gloo(0, 1, free_port())
    cfg = family_cfg(family_dirs[family], tiny_task_dir, tmp_path, "actor_rollout_ref.model.lora_rank=8",
                     "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=5e-2")
    worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
    worker.init_model(total_steps=2)
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    before = greedy_matches_training(worker, prompts)
    worker.update_actor(grpo_batch(worker.generate_sequences(prompts), worker))
    after = greedy_matches_training(worker, prompts)
    assert (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() > 1e-3


def _megatron_families(rank, port, dirs, task_dir, out_dir):
    from megatron.core import parallel_state as mpu

    init_gloo(rank, 2, port)
    for family, model_dir in dirs.items():
        cfg = family_cfg(model_dir, task_dir, f"{out_dir}/{family}", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                         config_name="ppo_megatron_trainer")
        worker = ActorRolloutRefWorker(cfg, rank, 2, "cpu")
        worker.init_model(total_steps=2)
        prompts = prompts_batch(worker.actor.hf_config.vocab_size)
        before = greedy_matches_training(worker, prompts)  # greedy: both TP ranks hold the same batch
        batch = [grpo_batch(before, worker)]
        torch.distributed.broadcast_object_list(batch, src=0)
        metrics = worker.update_actor(batch[0])
        assert rank != 0 or np.isfinite(metrics["actor/pg_loss"]), family  # metrics come from the output rank
        after = greedy_matches_training(worker, prompts)
        assert (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() > 1e-3, family
        mpu.destroy_model_parallel()
    close_gloo()


@pytest.mark.slow
def test_a_grpo_step_on_megatron_tp2_for_the_new_families(family_dirs, tiny_task_dir, tmp_path):
    """Qwen3 (q/k layernorm), Llama 3.2 (tied + llama3 RoPE) and Llama 3.1 (untied + llama3 RoPE) through the
    megatron converter at TP2; Qwen2 and the tied Llama are covered by tests/engine/test_megatron.py."""
    pytest.importorskip("megatron.core")
    dirs = {f: family_dirs[f] for f in ("tiny-qwen3", "tiny-llama3.2", "tiny-llama3.1")}
    spawn_ranks(_megatron_families, 2, lambda port: (port, dirs, tiny_task_dir, str(tmp_path)))
