"""The chunked / vocab-parallel log-prob head against plain full-vocabulary log-softmax: values and gradients."""

import pytest
import torch
from dist_utils import close_gloo, init_gloo, spawn_ranks

from rlcore.models import logits as logits_mod
from rlcore.models.logits import entropy_from_logits, gather_log_probs, token_log_probs

pytestmark = pytest.mark.numerics
# Logits are float32 (as in training) and summed in another order (by chunk, by vocabulary shard): logsumexp and
# E[z] differ by ~1e-6 relative, and H = logsumexp - E[z] cancels most of its magnitude, so allow 2e-5.
TOL = dict(atol=2e-5, rtol=1e-5)


def reference(hidden, weight, tokens, temperature):
    z = (hidden @ weight.t()).float() / temperature
    return gather_log_probs(z, tokens), entropy_from_logits(z)


def sum_pi_squared_reference(hidden, weight, temperature=1.0):
    """verl's calculate_sum_pi_squared_from_logits: exp(logsumexp(2z) - 2 logsumexp(z)), on full logits."""
    z = (hidden @ weight.t()).double() / temperature
    return torch.exp(torch.logsumexp(2.0 * z, -1) - 2.0 * torch.logsumexp(z, -1))


def problem(seed=0, tokens=37, hidden=16, vocab=50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 0.5
    t = torch.randint(0, vocab, (tokens,), generator=g)
    g_lp, g_ent = torch.randn(tokens, generator=g, dtype=torch.float64), torch.randn(tokens, generator=g, dtype=torch.float64)
    return h, w, t, g_lp, g_ent


def grads_of(fn, h, w, g_lp, g_ent):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    lp, ent = fn(h, w)[:2]
    (lp.double() * g_lp).sum().add((ent.double() * g_ent).sum()).backward()
    return lp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_head_equals_full_log_softmax_in_value_and_gradient(monkeypatch, temperature):
    # 7 tokens per chunk: 37 tokens are 6 chunks (the last one short).
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, g_lp, g_ent = problem()
    want = grads_of(lambda h, w: reference(h, w, t, temperature), h, w, g_lp, g_ent)
    got = grads_of(lambda h, w: token_log_probs(h, w, t, temperature, with_entropy=True), h, w, g_lp, g_ent)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), **TOL)


def test_sum_of_squared_probabilities_equals_verls_formula_and_leaves_the_gradient_alone(monkeypatch):
    """actor.calculate_sum_pi_squared (the optimal token baseline): sum_v p(v)^2 per token, chunk by chunk, equal to
    verl's formula on the full logits; asking for it changes neither the other outputs nor any gradient."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, g_lp, g_ent = problem()
    stats = token_log_probs(h, w, t, 0.7, with_sum_pi_squared=True)
    torch.testing.assert_close(stats.sum_pi_squared.double(), sum_pi_squared_reference(h, w, 0.7), **TOL)
    assert token_log_probs(h, w, t, 0.7).sum_pi_squared is None
    plain = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True), h, w, g_lp, g_ent)
    asked = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True, with_sum_pi_squared=True), h, w, g_lp, g_ent)
    for a, b in zip(asked, plain):
        assert torch.equal(a, b)


def test_use_torch_compile_compiles_the_chunk_kernels_with_the_same_values_and_gradients(monkeypatch):
    """actor.use_torch_compile: the head's per-chunk work runs torch.compile'd (fused elementwise passes); values
    and gradients equal the eager head's. Compiled only for a whole vocabulary of COMPILE_MIN_VOCAB columns or more
    (lowered here: the compile costs seconds that a small vocabulary never pays back) and never across TP shards."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    monkeypatch.setattr(logits_mod, "COMPILE_MIN_VOCAB", 50)
    monkeypatch.setattr(logits_mod, "_COMPILED", {})
    h, w, t, g_lp, g_ent = (x.float() if x.is_floating_point() else x for x in problem())
    eager = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True), h, w, g_lp, g_ent)
    assert logits_mod._COMPILED == {}
    compiled = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True, compiled=True), h, w, g_lp, g_ent)
    assert set(logits_mod._COMPILED) == {"_chunk_stats", "_chunk_grad"}  # forward and backward kernels
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, **TOL)
    spp = token_log_probs(h, w, t, 0.7, compiled=True, with_sum_pi_squared=True).sum_pi_squared
    torch.testing.assert_close(spp.double(), sum_pi_squared_reference(h, w, 0.7), **TOL)
    assert not logits_mod._VocabShard(0, 49, 49, None, compiled=True).compiled  # below the vocabulary threshold
    assert not logits_mod._VocabShard(0, 50, 100, "tp-group", compiled=True).compiled  # a TP shard: eager


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_final_logit_softcapping_bends_the_logits_in_value_and_gradient(monkeypatch, temperature):
    """Gemma's final_logit_softcapping inside the chunked head: log-probs, entropy and both gradients equal autograd
    through cap * tanh(z / cap) on the full logits, chunk by chunk."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 8)  # 8 tokens per chunk
    h, w, t, g_lp, g_ent = problem()
    cap = 2.0

    def capped(h, w):
        z = cap * torch.tanh((h @ w.t()).float() / cap) / temperature
        return gather_log_probs(z, t), entropy_from_logits(z)

    ours = grads_of(lambda h, w: token_log_probs(h, w, t, temperature, with_entropy=True, softcap=cap), h, w, g_lp, g_ent)
    for got, want in zip(ours, grads_of(capped, h, w, g_lp, g_ent)):
        torch.testing.assert_close(got.double(), want.double(), **TOL)
    uncapped = token_log_probs(h, w, t, temperature).log_probs
    assert (uncapped - ours[0]).abs().max() > 0.1  # the cap bends these logits: the check above can fail


def test_padding_columns_are_excluded(monkeypatch):
    h, w, t, g_lp, _ = problem()
    padded = torch.cat([w, torch.randn(6, w.shape[1], dtype=w.dtype)])  # 6 rows of TP padding past vocab 50
    lp, ent, _, spp = token_log_probs(h, padded, t, with_entropy=True, vocab_size=50, with_sum_pi_squared=True)
    want_lp, want_ent = reference(h, w, t, 1.0)
    torch.testing.assert_close(lp.double(), want_lp.double(), **TOL)
    torch.testing.assert_close(ent.double(), want_ent.double(), **TOL)
    torch.testing.assert_close(spp.double(), sum_pi_squared_reference(h, w), **TOL)


def test_top_log_prob_marks_exactly_the_greedy_tokens(monkeypatch):
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, _, _ = problem()
    z = (h @ w.t()).float()
    t = torch.where(torch.arange(len(t)) % 2 == 0, z.argmax(-1), t)  # half the targets are the greedy token
    lp, _, top, _ = token_log_probs(h, w, t)
    torch.testing.assert_close(top.double(), z.log_softmax(-1).max(-1).values.double(), **TOL)
    assert torch.equal(lp >= top, t == z.argmax(-1))  # exact: the same float z, minus the same logsumexp
    assert (t == z.argmax(-1)).sum() >= 19


def _shard_main(rank, world, port, out):
    init_gloo(rank, world, port)
    h, w, t, g_lp, g_ent = problem(tokens=20, vocab=45)  # 45 = 2 x 23 - 1: one padding row on rank 1
    per_rank = 23
    local = torch.zeros(per_rank, w.shape[1], dtype=w.dtype)
    rows = w[rank * per_rank : (rank + 1) * per_rank]
    local[: len(rows)] = rows
    lp, ent, gh, gw = grads_of(lambda h, w_: token_log_probs(h, w_, t, 0.7, True, vocab_start=rank * per_rank, vocab_size=45,
                                                             group=torch.distributed.group.WORLD), h, local, g_lp, g_ent)
    stats = token_log_probs(h, local, t, 0.7, vocab_start=rank * per_rank, vocab_size=45, group=torch.distributed.group.WORLD,
                            with_sum_pi_squared=True)
    torch.save({"lp": lp, "ent": ent, "gh": gh, "gw": gw[: len(rows)], "top": stats.top_log_probs, "spp": stats.sum_pi_squared},
               f"{out}.{rank}")
    close_gloo()


def test_vocab_parallel_over_two_ranks_equals_full(tmp_path):
    out = str(tmp_path / "r")
    spawn_ranks(_shard_main, 2, lambda port: (2, port, out))
    h, w, t, g_lp, g_ent = problem(tokens=20, vocab=45)
    want_lp, want_ent, want_gh, want_gw = grads_of(lambda h, w: reference(h, w, t, 0.7), h, w, g_lp, g_ent)
    parts = [torch.load(f"{out}.{r}") for r in range(2)]
    for p in parts:
        torch.testing.assert_close(p["lp"].double(), want_lp.double(), **TOL)
        torch.testing.assert_close(p["ent"].double(), want_ent.double(), **TOL)
        torch.testing.assert_close(p["gh"], want_gh, **TOL)  # summed over both vocabulary shards
        torch.testing.assert_close(p["top"].double(), ((h @ w.t()).float() / 0.7).log_softmax(-1).max(-1).values.double(), **TOL)
        torch.testing.assert_close(p["spp"].double(), sum_pi_squared_reference(h, w, 0.7), **TOL)
    torch.testing.assert_close(torch.cat([p["gw"] for p in parts]), want_gw, **TOL)
