"""The fused decode forward (one q/k/v GEMM, one gate/up GEMM) is the HF model's maths, and weight updates reach it."""

import pytest
import torch
from conftest import build_tiny_llama_dir

from rlcore.models.hf import load_causal_lm
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3"])
def model_dir(request, tiny_model_dir, tmp_path_factory):
    if request.param == "qwen3":  # q/k RMSNorm per head, no biases, head_dim != hidden / heads
        from rlcore.data.tokenizer import build_char_tokenizer
        from rlcore.models.random_init import build_model_dir

        return build_model_dir(str(tmp_path_factory.mktemp("qwen3")), "tiny-qwen3", build_char_tokenizer())
    return tiny_model_dir if request.param == "qwen2" else build_tiny_llama_dir(str(tmp_path_factory.mktemp("llama")))


def test_fused_decoder_equals_the_hf_modules_and_the_training_forward(model_dir):
    model = load_causal_lm(model_dir).eval()
    with torch.no_grad():  # norm weights other than ones, so a skipped or misplaced q/k norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    fused = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"))
    plain = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"))
    plain.decoder = None
    assert fused.decoder is not None
    for rollout in (fused, plain):
        rollout.update_weights(model.named_parameters())  # a tied head is one parameter
    # The HF parameters are views of the fused weights: the update above reached the fused GEMMs.
    layer = fused.model.model.layers[1]
    qkv = fused.decoder.layers[1][1]
    assert layer.self_attn.v_proj.weight.data_ptr() == qkv[-layer.self_attn.v_proj.weight.shape[0]:].data_ptr()
    torch.testing.assert_close(qkv[: layer.self_attn.q_proj.weight.shape[0]], model.model.layers[1].self_attn.q_proj.weight, rtol=0, atol=0)

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(6, 40, (3, 5), generator=g)
    prompts[1, :2] = 0
    ids, mask = prompts.repeat_interleave(4, 0), (prompts != 0).long().repeat_interleave(4, 0)
    greedy = SamplingParams(max_tokens=8, do_sample=False, stop_token_ids=[20])
    a, b = fused.generate(ids, mask, greedy), plain.generate(ids, mask, greedy)
    assert torch.equal(a.responses, b.responses)
    torch.testing.assert_close(a.response_log_probs, b.response_log_probs, atol=1e-5, rtol=1e-5)
    sampled = fused.generate(ids, mask, SamplingParams(max_tokens=8, temperature=0.8, stop_token_ids=list(range(6, 30)), seed=4))
    seq = assemble_sequences(ids, mask, sampled)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    expected = gather_log_probs(response_logits(logits, 8, temperature=0.8), sampled.responses) * sampled.response_mask
    torch.testing.assert_close(expected, sampled.response_log_probs, atol=1e-5, rtol=1e-5)
