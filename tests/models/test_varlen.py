"""Packed (remove-padding) sequences: packing layout by hand, and the CPU varlen attention against padded SDPA."""

import pytest
import torch
from dist_utils import make_rollout_batch

from rlcore.models import varlen
from rlcore.models.hf import load_causal_lm
from rlcore.models.varlen import (
    VARLEN_ATTENTION,
    AttentionOptions,
    attention_implementation,
    pack_sequences,
    packed_causal_attention,
    packed_kernel,
    unpack_responses,
)

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)


def test_pack_sequences_layout_by_hand():
    # Row 0: one pad, prompt [5, 6], response [7] + pad. Row 1: prompt [8, 9, 10], response [11, 12].
    input_ids = torch.tensor([[0, 5, 6, 7, 0], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack_sequences(input_ids, mask, positions, response_len=2)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]  # restarting per sequence
    assert packed.attention_kwargs["cu_seq_lens_q"].tolist() == [0, 3, 8]
    assert packed.attention_kwargs["max_length_q"] == 5
    # Response token 7 is predicted at packed 1 (token 6); 11 and 12 at packed 5 and 6 (tokens 10 and 11).
    assert packed.response_index.tolist() == [1, 5, 6]
    assert packed.response_valid.tolist() == [[True, False], [True, True]]
    out = unpack_responses(torch.tensor([[1.0], [2.0], [3.0]]), packed.response_valid)
    assert out[..., 0].tolist() == [[1.0, 0.0], [2.0, 3.0]]


def test_attention_implementation_is_chosen_by_padding_mode():
    assert attention_implementation(False) is None  # the model's own: sdpa, or eager where HF refuses sdpa
    assert attention_implementation(True) == VARLEN_ATTENTION


def test_the_gpu_never_gets_the_per_sequence_loop(monkeypatch):
    """flash-attn when installed, else torch's varlen kernel, else one padded SDPA call; fp32 or dropout (which the
    flash kernels do not take) go to padded SDPA; only the CPU runs the exact per-sequence path."""
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(varlen, "_flash_attn_varlen", lambda: object())
    assert packed_kernel(cuda, bf16) == "flash_attn" and packed_kernel(cuda, torch.float16, dropout=0.1) == "flash_attn"
    monkeypatch.setattr(varlen, "_flash_attn_varlen", lambda: None)
    monkeypatch.setattr(varlen, "_torch_varlen", lambda: (object(), True))
    assert packed_kernel(cuda, bf16) == "torch_varlen"
    assert packed_kernel(cuda, bf16, dropout=0.1) == "padded_sdpa" and packed_kernel(cuda, torch.float32) == "padded_sdpa"
    monkeypatch.setattr(varlen, "_torch_varlen", lambda: (None, False))
    assert packed_kernel(cuda, bf16) == "padded_sdpa"
    assert packed_kernel(torch.device("cpu"), bf16) == packed_kernel(torch.device("cpu"), torch.float32) == "segments"


def test_flash_attn_backward_is_deterministic_under_the_runs_switches(monkeypatch):
    """rollout.full_determinism / engine.full_determinism turn torch's deterministic algorithms on
    (rlcore.utils.determinism); flash-attn's backward then runs without its atomic dQ sums."""
    calls = []
    monkeypatch.setattr(varlen, "_flash_attn_varlen", lambda: lambda *args, **kwargs: calls.append(kwargs["deterministic"]))
    q, cu = torch.zeros(3, 2, 8), torch.tensor([0, 3], dtype=torch.int32)

    def run():
        varlen._varlen_kernel("flash_attn", q, q, q, cu, 3, None, 0.0, (-1, 0), AttentionOptions())

    run()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        run()
    finally:
        torch.use_deterministic_algorithms(False)
    assert calls == [False, True]


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_padded_sdpa_kernel_equals_the_per_sequence_path(kv_heads):
    """The GPU's fallback, checked on CPU: one SDPA over right-padded rows gives every token of every sequence the
    per-sequence result (GQA too), with sequences of very different lengths (one of a single token)."""
    torch.manual_seed(0)
    lengths = [7, 1, 12, 3, 12]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(4, sum(lengths), 16)
    k, v = torch.randn(2, kv_heads, sum(lengths), 16).unbind(0)
    exact = packed_causal_attention(q, k, v, cu, max(lengths), scale=0.3, kernel="segments")
    padded = packed_causal_attention(q, k, v, cu, max(lengths), scale=0.3, kernel="padded_sdpa")
    assert padded.shape == exact.shape == (sum(lengths), 4, 16)
    torch.testing.assert_close(padded, exact, atol=1e-6, rtol=1e-5)


def test_packed_forward_equals_padded_forward_on_every_valid_token(tiny_model_dir):
    padded_model = load_causal_lm(tiny_model_dir).eval()
    packed_model = load_causal_lm(tiny_model_dir, attn_implementation=attention_implementation(True)).eval()
    b = make_rollout_batch(6, 7, 9, padded_model.config.vocab_size, seed=5)
    mask = b["attention_mask"].bool()
    packed = pack_sequences(b["input_ids"], b["attention_mask"], b["position_ids"], response_len=9)
    with torch.no_grad():
        padded = padded_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
        out = packed_model(input_ids=packed.input_ids, position_ids=packed.position_ids, **packed.attention_kwargs).logits
    assert out.shape[1] == int(mask.sum())  # no compute on padding
    torch.testing.assert_close(out[0], padded[mask], atol=1e-5, rtol=1e-5)


def _reference(q, k, v, lengths, scale, window=None, softcap=None, sinks=None):
    """Each sequence alone, one query at a time, written out: the keys it may see, capped logits, a sink logit."""
    out, start = [], 0
    group = q.shape[0] // k.shape[0]
    for length in lengths:
        for i in range(length):
            first = max(0, i - window + 1) if window else 0
            rows = []
            for h in range(q.shape[0]):
                logits = (k[h // group, start + first : start + i + 1] @ q[h, start + i]) * scale
                if softcap:
                    logits = softcap * torch.tanh(logits / softcap)
                extra = sinks[h : h + 1] if sinks is not None else logits[:0]
                probs = torch.cat([logits, extra]).softmax(0)[: len(logits)]
                rows.append(probs @ v[h // group, start + first : start + i + 1])
            out.append(torch.stack(rows))
        start += length
    return torch.stack(out)


@pytest.mark.parametrize("kernel", ["segments", "padded_sdpa"])
@pytest.mark.parametrize("options", [dict(window=3), dict(softcap=0.7), dict(sinks=True), dict(window=4, softcap=0.5, sinks=True)],
                         ids=["window", "softcap", "sinks", "all"])
def test_what_a_layer_asks_is_honoured_on_every_cpu_kernel(kernel, options):
    """Sliding windows, soft-capping and attention sinks, with grouped-query heads and a value head dim narrower than
    the keys' (MLA), equal each sequence attended alone and written out query by query."""
    torch.manual_seed(0)
    lengths = [7, 1, 5, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = torch.randn(4, sum(lengths), 16), torch.randn(2, sum(lengths), 16), torch.randn(2, sum(lengths), 8)
    sinks = torch.randn(4) if options.get("sinks") else None
    opts = AttentionOptions(window=options.get("window"), softcap=options.get("softcap"), sinks=sinks)
    out = packed_causal_attention(q, k, v, cu, max(lengths), scale=0.3, kernel=kernel, options=opts)
    expected = _reference(q, k, v, lengths, 0.3, opts.window, opts.softcap, sinks)
    assert out.shape == (sum(lengths), 4, 8)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    plain = packed_causal_attention(q, k, v, cu, max(lengths), scale=0.3, kernel=kernel)
    assert (plain - out).abs().max() > 1e-2  # each option changes the result: the check above can fail


def test_options_come_from_the_layers_kwargs_and_a_window_no_sequence_reaches_is_dropped():
    module = torch.nn.Module()
    module.sliding_window = 5  # read only when the layer passes no sliding_window kwarg
    assert AttentionOptions.of(module, {}).window == 5
    assert AttentionOptions.of(module, {"sliding_window": None}).window is None  # a global layer of a sliding model
    sinks = torch.zeros(4)
    opts = AttentionOptions.of(module, {"sliding_window": 8, "softcap": 50.0, "s_aux": sinks})
    assert (opts.window, opts.softcap, opts.sinks is sinks) == (8, 50.0, True)
    assert opts.within(8).window is None and opts.within(9).window == 8
    assert opts.heads(2, 2).sinks.shape == (2,)
