"""The native engine's CUDA-graph decode on a real GPU (marker `gpu`; skipped without CUDA): the graphs give the eager
decode's tokens, and how many tokens/s each makes (printed; run with -s to see them).

    python -m pytest -m gpu -s tests/gpu/test_rollout_graphs.py
"""

import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def engines(path: str, dtype: str, max_num_seqs: int) -> dict:
    """An eager engine and a graph engine with the same weights."""
    from rlcore.models.hf import load_causal_lm
    from rlcore.rollout.native import NativeRollout

    weights = load_causal_lm(path).named_parameters()
    weights = [(name, tensor.detach().clone()) for name, tensor in weights]
    out = {}
    for eager in (True, False):
        rollout = NativeRollout(path, pad_token_id=0, device=torch.device("cuda", 0), dtype=dtype, max_num_seqs=max_num_seqs,
                                enforce_eager=eager)
        rollout.update_weights(weights)
        out["eager" if eager else "graphs"] = rollout
    assert out["graphs"].graphs is not None and out["eager"].graphs is None
    return out


@pytest.mark.parametrize("shape", ["tiny-qwen3", "qwen2.5-0.5b"])
def test_graph_decode_equals_eager_decode_on_cuda(tmp_path, shape):
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import build_model_dir
    from rlcore.rollout.base import SamplingParams

    path = build_model_dir(str(tmp_path / shape), shape, build_char_tokenizer())
    torch.cuda.set_device(0)
    pair = engines(path, "float32", max_num_seqs=48)
    pair["graphs"].graphs.capture_after = 1  # every bucket captured at first use: several captures to check
    prompts = torch.randint(6, 40, (12, 8), generator=torch.Generator().manual_seed(0))
    prompts[2, :3] = 0
    ids, mask = prompts.repeat_interleave(4, 0), (prompts != 0).long().repeat_interleave(4, 0)
    # Stop tokens end rows at different steps: the batch shrinks through several buckets.
    sampling = SamplingParams(max_tokens=24, temperature=1.0, stop_token_ids=list(range(6, 12)), seed=5)
    eager, graphs = (pair[k].generate(ids, mask, sampling) for k in ("eager", "graphs"))
    state = pair["graphs"].graphs
    assert not state.disabled and len(state.verified) >= 2, (state.disabled, state.verified)
    assert torch.equal(eager.responses, graphs.responses)
    torch.testing.assert_close(graphs.response_log_probs, eager.response_log_probs, atol=1e-3, rtol=1e-3)
    again = pair["graphs"].generate(ids, mask, sampling)  # replays only: the pool and the graphs are kept
    assert torch.equal(again.responses, eager.responses)
    riding = engines(path, "float32", max_num_seqs=48)["graphs"]  # the default: the tail rides larger captured buckets
    assert torch.equal(riding.generate(ids, mask, sampling).responses, eager.responses)
    assert 0 < riding.stats["graph_captures"] <= len(state.verified), (riding.stats, state.verified)


def test_graph_decode_throughput_on_cuda(tmp_path):
    """bf16, a Qwen2.5-0.5B shape (char vocabulary), 256 sequences x 128 tokens, no early stops."""
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import build_model_dir
    from rlcore.rollout.base import SamplingParams

    path = build_model_dir(str(tmp_path / "m"), "qwen2.5-0.5b", build_char_tokenizer())
    torch.cuda.set_device(0)
    pair = engines(path, "bfloat16", max_num_seqs=256)
    ids = torch.randint(6, 40, (64, 32), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, 0)
    mask = torch.ones_like(ids)
    sampling = SamplingParams(max_tokens=128, temperature=1.0, seed=1)
    rates = {}
    for name, rollout in pair.items():
        rollout.generate(ids, mask, sampling)  # warm-up (and capture, for graphs) on the pool the timed call keeps
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = rollout.generate(ids, mask, sampling)
        torch.cuda.synchronize()
        rates[name] = float(out.response_mask.sum()) / (time.perf_counter() - start)
    print(f"\nnative rollout, {torch.cuda.get_device_name()}: eager {rates['eager']:.0f} tok/s, CUDA graphs {rates['graphs']:.0f} tok/s "
          f"({rates['graphs'] / rates['eager']:.2f}x)")
    assert not pair["graphs"].graphs.disabled
