"""The vLLM distillation teacher on vLLM's CPU build, run for real: its per-token log-probs and top-k on a padded batch
are those of the teacher's own HF forward in fp32, and what vLLM cannot compute exactly (another temperature) is
refused. `make test-vllm` runs it in .cache/vllm_venv."""

import pytest
import torch
from conftest import build_tiny_model_dir

from rlcore.models.hf import load_causal_lm
from rlcore.protocol import position_ids_from_mask
from rlcore.rollout.vllm_teacher import VLLMTeacher

pytestmark = pytest.mark.vllm

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOPK = 8
PROMPT_LEN, RESPONSE_LEN = 6, 5
# Real lengths per row (prompt, response): a full row, a short prompt with a padded response, a one-token prompt.
LENGTHS = [(6, 5), (3, 2), (1, 4)]
# A random model's next-token distribution is nearly flat (top-9 within 0.25 nats, neighbours 2e-4 apart): its top-k
# order would hang on rounding. A sharper head spreads it out (neighbours >= 5.7e-4 apart on this batch) while the
# log-probs stay small enough for fp32 to match within 2e-6.
HEAD_SCALE = 8.0
# Neighbouring top-k log-probs closer than this may swap between two fp32 forwards: ids are compared where the gaps
# on both sides are wider.
TIE_GAP = 1e-4


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """Overrides conftest's teardown: the module's lone vLLM engine owns a world-1 process group until it shuts down."""
    yield


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """rlcore's layout: prompts left-padded in the first PROMPT_LEN columns, responses right-padded after them."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(LENGTHS), PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (prompt, response) in enumerate(LENGTHS):
        mask[row, PROMPT_LEN - prompt : PROMPT_LEN + response] = 1
    ids[mask.bool()] = torch.randint(3, 100, (int(mask.sum()),), generator=generator)
    return ids, mask


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    model_dir = build_tiny_model_dir(str(tmp_path_factory.mktemp("vllm_teacher")), hidden=128)  # head_dim 32: vLLM CPU's minimum
    model = load_causal_lm(model_dir).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(model_dir)
    # A 12-token step budget schedules the batch's 11 + 5 + 5 tokens as 11 + 1 and 4 + 5 (measured): the second row's
    # prompt log-probs arrive in two chunks (chunked prefill).
    engine = VLLMTeacher(model_dir, device=DEVICE, dtype="float32", max_model_len=64, max_num_seqs=4, max_num_batched_tokens=12,
                         topk=TOPK, engine_kwargs={"kv_cache_memory_bytes": 8 * 2**20})
    return engine, model


def hf_response_log_probs(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / temperature) at the positions predicting the response columns: `[batch, R, vocab]`."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    return (logits[:, PROMPT_LEN - 1 : -1].float() / temperature).log_softmax(-1)


def test_log_probs_and_top_k_are_the_hf_forwards(teacher):
    engine, model = teacher
    ids, mask = padded_batch()
    out = engine.score(ids, mask, RESPONSE_LEN, topk=TOPK, temperature=1.0)
    expected = hf_response_log_probs(model, ids, mask, 1.0)
    scored = mask[:, PROMPT_LEN:].bool()
    assert out["log_probs"].dtype == out["topk_log_probs"].dtype == torch.float32 and out["topk_ids"].dtype == torch.int64
    assert out["topk_ids"].shape == out["topk_log_probs"].shape == (len(LENGTHS), RESPONSE_LEN, TOPK)

    sampled = expected.gather(-1, ids[:, PROMPT_LEN:, None]).squeeze(-1) * scored
    torch.testing.assert_close(out["log_probs"], sampled, atol=1e-5, rtol=0)
    top = expected.topk(TOPK + 1, dim=-1)
    torch.testing.assert_close(out["topk_log_probs"], top.values[..., :TOPK] * scored[..., None], atol=1e-5, rtol=0)
    # The teacher's own values are sorted: descending along k.
    assert (out["topk_log_probs"][..., :-1] >= out["topk_log_probs"][..., 1:]).all()

    gaps = top.values[..., :-1] - top.values[..., 1:]  # [batch, R, K]: gap to the next
    gap_before = torch.cat([torch.full_like(gaps[..., :1], float("inf")), gaps[..., :-1]], dim=-1)
    clear = (gaps > TIE_GAP) & (gap_before > TIE_GAP) & scored[..., None]
    assert clear.float().sum() >= 0.9 * scored.sum() * TOPK  # the comparison covers nearly every real entry
    assert torch.equal(out["topk_ids"][clear], top.indices[..., :TOPK][clear])
    # Padding: zeros and id 0.
    assert not out["log_probs"][~scored].any() and not out["topk_log_probs"][~scored].any() and not out["topk_ids"][~scored].any()


def test_fewer_or_no_top_k_tokens_give_the_same_log_probs(teacher):
    engine, _ = teacher
    ids, mask = padded_batch()
    full = engine.score(ids, mask, RESPONSE_LEN, topk=TOPK, temperature=1.0)
    three = engine.score(ids, mask, RESPONSE_LEN, topk=3, temperature=1.0)
    none = engine.score(ids, mask, RESPONSE_LEN, topk=0, temperature=1.0)
    assert set(none) == {"log_probs"}
    assert torch.equal(none["log_probs"], full["log_probs"]) and torch.equal(three["log_probs"], full["log_probs"])
    torch.testing.assert_close(three["topk_log_probs"], full["topk_log_probs"][..., :3], atol=0, rtol=0)


def test_what_vllm_cannot_score_exactly_is_refused_with_the_key_to_change(teacher):
    engine, _ = teacher
    ids, mask = padded_batch()
    # vLLM's prompt log-probs ignore the temperature (read in its source; rlcore.rollout.vllm_teacher).
    with pytest.raises(ValueError, match=r"distillation\.teacher_models\.teacher_model\.inference\.temperature=0\.7"):
        engine.score(ids, mask, RESPONSE_LEN, topk=TOPK, temperature=0.7)
    with pytest.raises(ValueError, match=r"distillation\.distillation_loss\.topk=9"):
        engine.score(ids, mask, RESPONSE_LEN, topk=TOPK + 1, temperature=1.0)
    long_ids = torch.randint(3, 100, (1, 64))
    with pytest.raises(ValueError, match=r"inference\.max_model_len=64"):
        engine.score(long_ids, torch.ones_like(long_ids), 8, topk=0, temperature=1.0)
