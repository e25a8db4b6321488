"""The hybrid engine on 2 gloo ranks with vLLM for real: an FSDP2 training engine streams its weights into one vLLM
engine per rank (external_launcher over the trainer's process group), as DP2 x TP1 and as TP2 across both ranks.
What comes back must be what the training forward computes, and DP replicas must sample differently."""

import pytest
import torch
from conftest import build_tiny_llama_dir, build_tiny_model_dir
from dist_utils import close_gloo, init_gloo, spawn_ranks

from rlcore.config.megatron_schema import MegatronConfig

pytestmark = pytest.mark.vllm
MAX_TOKENS = 6


def build_source(name: str, model_dir: str):
    """The training engine that feeds vLLM: FSDP2 over both ranks, or Megatron TP2 (each rank holds half of each layer,
    which rollout_weights gathers into HF tensors)."""
    from rlcore.engine.base import EngineSpec
    from rlcore.engine.factory import build_engine

    if name == "fsdp2":
        return build_engine("fsdp2", EngineSpec(model_path=model_dir), torch.device("cpu"))
    megatron = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                    sequence_parallel=False, use_distributed_optimizer=True, seed=1)
    return build_engine("megatron", EngineSpec(model_path=model_dir, megatron=MegatronConfig(**megatron), param_dtype="float32"), torch.device("cpu"))


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, tp: int, source: str, out_path: str) -> None:
    import os

    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    from rlcore.engine.base import TokenRequest
    from rlcore.models.hf import load_causal_lm
    from rlcore.protocol import DataProto
    from rlcore.rollout.base import SamplingParams, assemble_sequences
    from rlcore.rollout.factory import build_rollout
    from rlcore.rollout.weight_sync import sync_weights

    init_gloo(rank, world_size, port)
    torch.manual_seed(0)
    engine = build_source(source, model_dir)
    with torch.no_grad():  # the "trained" weights differ from the checkpoint vLLM could have read from disk
        for p in engine.model.parameters() if source == "fsdp2" else (p for chunk in engine.model for p in chunk.parameters()):
            p.add_(0.05 * torch.randn_like(p))
    rollout = build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=torch.device("cpu"), dtype="float32", seed=0,
                            tensor_parallel_size=tp, max_model_len=64, max_num_seqs=32, enforce_eager=True)
    sync_weights(engine, rollout)
    full = load_causal_lm(model_dir).eval()
    full.load_state_dict(dict(engine.rollout_weights()), strict=False)  # strict=False: a tied head may be left out
    # Each rank its own prompts (a DP shard), left-padded; Megatron TP2 is one replica: both ranks get the same.
    shard = rank if source == "fsdp2" else 0
    ids = torch.tensor([[0, 7 + shard, 8, 9], [10, 11, 12 + shard, 13], [0, 0, 20, 21 + shard]])
    mask = (ids != 0).long()
    result = {}
    for tag, sampling in (("greedy", SamplingParams(max_tokens=MAX_TOKENS, do_sample=False)),
                          ("sampled", SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8))):
        out = rollout.generate(ids, mask, sampling)
        if source != "fsdp2":  # Megatron's TP ranks must forward the same rows: rank 0's samples on both
            for tensor in (out.responses, out.response_log_probs, out.response_mask):
                torch.distributed.broadcast(tensor, 0)
        seq = DataProto.from_dict(assemble_sequences(ids, mask, out))
        temperature = 1.0 if sampling.greedy else sampling.temperature
        outputs = engine.forward([seq], lambda o, mb: {"lp": o["log_probs"]}, TokenRequest(temperature))  # [] off output ranks
        train_lp = outputs[0]["lp"] * out.response_mask if outputs else None
        hf = full.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
        result[tag] = {"responses": out.responses, "rollout_lp": out.response_log_probs * out.response_mask,
                       "train_lp": train_lp, "hf_greedy": hf[:, ids.shape[1]:]}
    # The same prompt n=8 times, as the trainer repeats it: within a rank the samples differ, and so do the ranks'.
    same = torch.tensor([[5, 6, 7, 8]]).repeat(8, 1)
    result["group"] = rollout.generate(same, torch.ones_like(same), SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)).responses
    if tp == 2 and source == "fsdp2":
        result["teacher"] = _score_with_a_tp2_teacher(model_dir, rank, ids, mask)
        torch.save(result, f"{out_path}.{rank}")
        return  # the teacher engine's shutdown destroyed the process groups: no close_gloo after it
    torch.save(result, f"{out_path}.{rank}")
    close_gloo()


def _score_with_a_tp2_teacher(model_dir: str, rank: int, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """A distillation teacher at inference.tensor_model_parallel_size=2 (verl's OPD scripts), built beside the TP2
    rollout in the same processes: each rank scores its own rows and gets its own rows' log-probs back. Returns their
    largest gap to the checkpoint's HF forward (the teacher reads the checkpoint; no sync reaches it)."""
    from rlcore.models.hf import load_causal_lm
    from rlcore.protocol import position_ids_from_mask
    from rlcore.rollout.vllm_teacher import VLLMTeacher

    teacher = VLLMTeacher(model_dir, device=torch.device("cpu"), dtype="float32", max_model_len=64, max_num_seqs=4,
                          tensor_parallel_size=2, engine_kwargs={"kv_cache_memory_bytes": 8 * 2**20})
    responses = torch.randint(3, 100, (ids.shape[0], 3), generator=torch.Generator().manual_seed(rank))
    full_ids, full_mask = torch.cat([ids, responses], 1), torch.cat([mask, torch.ones_like(responses)], 1)
    scored = teacher.score(full_ids, full_mask, responses.shape[1], 0, 1.0)["log_probs"]
    with torch.no_grad():
        logits = load_causal_lm(model_dir).eval()(input_ids=full_ids, attention_mask=full_mask,
                                                   position_ids=position_ids_from_mask(full_mask)).logits
    hf = logits[:, ids.shape[1] - 1 : -1].float().log_softmax(-1).gather(-1, responses[..., None])[..., 0]
    return float((scored - hf).abs().max())


def run_two_ranks(model_dir: str, tp: int, tmp_path, source: str = "fsdp2") -> list[dict]:
    out = str(tmp_path / "result")
    spawn_ranks(_rank_main, 2, lambda port: (2, port, model_dir, tp, source, out))
    return [torch.load(f"{out}.{rank}") for rank in range(2)]


def check_against_training(results: list[dict]) -> None:
    for rank, result in enumerate(results):
        greedy = result["greedy"]
        assert torch.equal(greedy["responses"], greedy["hf_greedy"]), f"rank {rank}"
        for tag in ("greedy", "sampled"):
            if result[tag]["train_lp"] is None:  # Megatron: only TP rank 0 returns the forward's outputs
                continue
            torch.testing.assert_close(result[tag]["rollout_lp"], result[tag]["train_lp"], atol=1e-5, rtol=0, msg=f"rank {rank} {tag}")


@pytest.mark.parametrize("tp", [1, 2])
def test_fsdp2_into_vllm_matches_the_training_forward(tmp_path, tp):
    """tp=1: two DP replicas (one engine per rank); tp=2: one engine sharded over both ranks."""
    results = run_two_ranks(build_tiny_model_dir(str(tmp_path / "qwen"), hidden=128), tp, tmp_path)
    check_against_training(results)
    groups = [r["group"] for r in results]
    for group in groups:
        assert len({tuple(row) for row in group.tolist()}) > 4  # n samples of one prompt differ
    assert not torch.equal(groups[0], groups[1])  # DP replicas (tp=1) or the two halves of one TP batch (tp=2) differ
    if tp == 2:  # a TP2 teacher beside the TP2 rollout: each rank's rows scored as HF's forward scores them
        assert [r["teacher"] < 2e-6 for r in results] == [True, True], [r["teacher"] for r in results]


def test_tied_llama_through_fsdp2_tp2(tmp_path):
    """Tied embeddings, an odd vocabulary vLLM pads for TP, 4 query heads per KV head: over TP2."""
    model_dir = build_tiny_llama_dir(str(tmp_path / "llama"), layers=2, hidden=256, heads=8)  # head_dim 32, 2 KV heads: one per TP rank
    check_against_training(run_two_ranks(model_dir, 2, tmp_path))


def test_megatron_tp2_into_vllm_tp2_matches_the_training_forward(tmp_path):
    """Megatron's TP shards are gathered into HF tensors by rollout_weights and re-sharded by vLLM's loaders."""
    pytest.importorskip("megatron.core")
    results = run_two_ranks(build_tiny_model_dir(str(tmp_path / "qwen"), hidden=128), 2, tmp_path, source="megatron")
    check_against_training(results)
    assert results[0]["greedy"]["train_lp"] is not None


VISION_PROMPTS = {0: [("<image>count", [(56, 28)]), ("what?", [])], 1: [("<image><image>same?", [(28, 28), (56, 56)]), ("<image> and", [(28, 56)])]}


def _vision_rank(rank: int, world_size: int, port: int, model_dir: str, out_path: str) -> None:
    """TP2 over both ranks with images: each rank hands vLLM its own rows (prompt ids and PIL images); the TP group
    gathers them so both ranks submit the same requests, and each rank gets its rows back."""
    import os

    import numpy as np
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    from rlcore.data.multimodal import process_row
    from rlcore.families.vision import placeholder_token_ids
    from rlcore.models.vision import load_processor
    from rlcore.rollout.base import SamplingParams
    from rlcore.rollout.factory import build_rollout
    from rlcore.rollout.weight_sync import sync_weights

    init_gloo(rank, world_size, port)
    torch.manual_seed(0)
    engine = build_source("fsdp2", model_dir)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    rollout = build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=torch.device("cpu"), dtype="float32", seed=0,
                            tensor_parallel_size=2, max_model_len=128, max_num_seqs=8, enforce_eager=True)
    sync_weights(engine, rollout)
    full = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    full.load_state_dict(dict(engine.rollout_weights()), strict=False)
    processor = load_processor(model_dir)
    rows = [process_row(processor, [{"role": "user", "content": text}],
                        [Image.fromarray((np.random.RandomState(i + 10 * rank).rand(h, w, 3) * 255).astype(np.uint8)) for i, (w, h) in enumerate(sizes)])
            for text, sizes in VISION_PROMPTS[rank]]
    width = max(len(row_ids) for row_ids, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (row_ids, _, _) in enumerate(rows):
        ids[i, width - len(row_ids):] = torch.tensor(row_ids)
    out = rollout.generate(ids, (ids != 0).long(), SamplingParams(max_tokens=MAX_TOKENS, do_sample=False),
                           multi_modal_data=[{"image": pil} if pil else None for _, _, pil in rows])
    equal = []
    for i, (row_ids, inputs, _) in enumerate(rows):
        prompt = torch.tensor([row_ids])
        with torch.no_grad():
            greedy = full.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), mm_token_type_ids=(prompt == full.config.image_token_id).int(),
                                   max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None,
                                   suppress_tokens=list(placeholder_token_ids(full.config)), **inputs)[0, prompt.shape[1]:]
        equal.append(torch.equal(out.responses[i], greedy))
    torch.save(equal, f"{out_path}.{rank}")  # vLLM's shutdown destroys the process groups: no close_gloo after it


def test_vllm_tp2_rolls_out_images_each_rank_its_own_rows(tmp_path):
    """verl's VLM scripts run vLLM at TP2: after a sync of changed weights, each rank's greedy tokens from its own
    rows with images are HF's."""
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.vision import build_vl_model_dir

    model_dir = build_vl_model_dir(str(tmp_path / "vl"), "tiny-qwen2-5-vl", build_char_tokenizer(), text=dict(hidden_size=128, head_dim=32),
                                   vision=dict(hidden_size=64, out_hidden_size=128))
    out = str(tmp_path / "result")
    spawn_ranks(_vision_rank, 2, lambda port: (2, port, model_dir, out))
    assert [torch.load(f"{out}.{rank}") for rank in range(2)] == [[True, True], [True, True]]
