"""The chunked / vocab-parallel log-prob head against plain full-vocabulary log-softmax: values and gradients."""

from types import SimpleNamespace

import pytest
import torch
from dist_utils import close_gloo, init_gloo, spawn_ranks

from rlcore.models import logits as logits_mod
from rlcore.models.logits import TokenStats, entropy_from_logits, gather_log_probs, stack_channels, token_log_probs, unstack_channels

pytestmark = pytest.mark.numerics
# Logits are float32 (as in training) and summed in another order (by chunk, by vocabulary shard): logsumexp and
# E[z] differ by ~1e-6 relative, and H = logsumexp - E[z] cancels most of its magnitude, so allow 2e-5.
TOL = dict(atol=2e-5, rtol=1e-5)


def reference(hidden, weight, tokens, temperature):
    z = (hidden @ weight.t()).float() / temperature
    return gather_log_probs(z, tokens), entropy_from_logits(z)


def full_logits(hidden, weight, temperature=1.0, cap=None):
    z = (hidden @ weight.t()).float()
    return (cap * torch.tanh(z / cap) if cap else z) / temperature


def columns_reference(hidden, weight, columns, temperature=1.0, cap=None):
    """(`[tokens, C]` log_softmax gathered at each column's id, entropy) on the full logits, by autograd."""
    z = full_logits(hidden, weight, temperature, cap)
    return z.log_softmax(-1).gather(-1, columns), entropy_from_logits(z)


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


def token_columns(tokens, vocab=50, num_columns=3, seed=1):
    """`[tokens, C]` ids: the sampled token, then others (a teacher's top ids). Every third row has its sampled
    token again in the last column: that token's gradient is both columns' (a scatter that overwrote would fail)."""
    g = torch.Generator().manual_seed(seed)
    extra = torch.randint(0, vocab, (len(tokens), num_columns - 1), generator=g)
    extra[::3, -1] = tokens[::3]
    grads = torch.randn(len(tokens), num_columns, generator=g, dtype=torch.float64)
    return torch.cat([tokens[:, None], extra], -1), grads


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
    cols, g_cols = token_columns(t)  # several token columns through the same two kernels
    eager = grads_of(lambda h, w: token_log_probs(h, w, cols, 0.7, with_entropy=True), h, w, g_cols, g_ent)
    compiled = grads_of(lambda h, w: token_log_probs(h, w, cols, 0.7, with_entropy=True, compiled=True), h, w, g_cols, g_ent)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, **TOL)
    top = token_log_probs(h, w, t, 0.7, compiled=True, topk=4)
    want_values, want_ids = full_logits(h, w, 0.7).log_softmax(-1).topk(4)
    torch.testing.assert_close(top.topk_log_probs, want_values, **TOL)
    assert torch.equal(top.topk_ids, want_ids)
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
    lp, ent, _, spp = token_log_probs(h, padded, t, with_entropy=True, vocab_size=50, with_sum_pi_squared=True)[:4]
    want_lp, want_ent = reference(h, w, t, 1.0)
    torch.testing.assert_close(lp.double(), want_lp.double(), **TOL)
    torch.testing.assert_close(ent.double(), want_ent.double(), **TOL)
    torch.testing.assert_close(spp.double(), sum_pi_squared_reference(h, w), **TOL)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_suppressed_ids_are_out_of_the_distribution_in_value_and_gradient(monkeypatch, temperature):
    """A vision-language model's placeholders (never sampled): log-probs, entropy and gradients are those of the
    softmax over the other ids, chunk by chunk (7 tokens a chunk) as whole."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, g_lp, g_ent = problem()
    suppressed = (3, 17, 49)
    t = torch.where(torch.isin(t, torch.tensor(suppressed)), 0, t)  # sampled tokens are never suppressed ones

    def masked(h, w):
        z = (h @ w.t()).float() / temperature
        z[:, list(suppressed)] = float("-inf")
        return gather_log_probs(z, t), -(z.softmax(-1) * z.log_softmax(-1).nan_to_num(neginf=0.0)).sum(-1)

    want = grads_of(masked, h, w, g_lp, g_ent)
    got = grads_of(lambda h, w: token_log_probs(h, w, t, temperature, with_entropy=True, suppressed=suppressed), h, w, g_lp, g_ent)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), **TOL)
    assert float((got[0] - grads_of(lambda h, w: reference(h, w, t, temperature), h, w, g_lp, g_ent)[0]).abs().max()) > 1e-3


def test_top_log_prob_marks_exactly_the_greedy_tokens(monkeypatch):
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, _, _ = problem()
    z = (h @ w.t()).float()
    t = torch.where(torch.arange(len(t)) % 2 == 0, z.argmax(-1), t)  # half the targets are the greedy token
    lp, _, top, _ = token_log_probs(h, w, t)[:4]
    torch.testing.assert_close(top.double(), z.log_softmax(-1).max(-1).values.double(), **TOL)
    assert torch.equal(lp >= top, t == z.argmax(-1))  # exact: the same float z, minus the same logsumexp
    assert (t == z.argmax(-1)).sum() >= 19


@pytest.mark.parametrize("temperature, cap", [(0.7, None), (1.0, 2.0)])
def test_several_token_columns_each_get_their_log_prob_and_gradient(monkeypatch, temperature, cap):
    """On-policy distillation: `[tokens, C]` ids (the sampled token, a teacher's top ids) get `[tokens, C]` log-probs
    under one distribution, each with its gradient, equal to log_softmax gathered from the full (soft-capped) logits
    in value and in both gradients; column 0 is what the `[tokens]` call returns."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, _, g_ent = problem()
    cols, g_cols = token_columns(t)
    ours = grads_of(lambda h, w: token_log_probs(h, w, cols, temperature, with_entropy=True, softcap=cap), h, w, g_cols, g_ent)
    want = grads_of(lambda h, w: columns_reference(h, w, cols, temperature, cap), h, w, g_cols, g_ent)
    for got, expected in zip(ours, want):
        torch.testing.assert_close(got.double(), expected.double(), **TOL)
    assert ours[0].shape == (37, 3)
    torch.testing.assert_close(ours[0][:, 0], token_log_probs(h, w, t, temperature, softcap=cap).log_probs)


def test_top_k_equals_torch_topk_of_the_full_log_softmax_without_padding_or_gradient(monkeypatch):
    """topk=K: the K largest log-probs (descending) and their ids, as torch.topk of the full soft-capped log-softmax,
    for a whole vocabulary and for one with TP padding rows (whose logits would win if they were not masked); no
    gradient, and asking for them changes no other gradient."""
    monkeypatch.setattr(logits_mod, "LOGITS_CHUNK_BYTES", 4 * 50 * 7)
    h, w, t, g_lp, g_ent = problem()
    padded = torch.cat([w, 5.0 * torch.randn(6, w.shape[1], generator=torch.Generator().manual_seed(3), dtype=w.dtype)])
    want_values, want_ids = full_logits(h, w, 0.7, cap=2.0).log_softmax(-1).topk(5)
    assert (full_logits(h, padded, 0.7, cap=2.0).topk(5).indices >= 50).any()  # unmasked, the padding would show
    for weight in (w, padded):
        stats = token_log_probs(h, weight.clone().requires_grad_(), t, 0.7, vocab_size=50, softcap=2.0, topk=5)
        torch.testing.assert_close(stats.topk_log_probs, want_values, **TOL)
        assert torch.equal(stats.topk_ids, want_ids) and stats.topk_ids.dtype == torch.int64
        assert not stats.topk_log_probs.requires_grad and not stats.topk_ids.requires_grad
    assert token_log_probs(h, w, t).topk_ids is None
    plain = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True), h, w, g_lp, g_ent)
    asked = grads_of(lambda h, w: token_log_probs(h, w, t, 0.7, with_entropy=True, topk=5), h, w, g_lp, g_ent)
    for a, b in zip(asked, plain):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="topk=51 must be in"):
        token_log_probs(h, w, t, topk=51)


def _shard_main(rank, world, port, out):
    init_gloo(rank, world, port)
    h, w, t, g_lp, g_ent = problem(tokens=20, vocab=45)  # 45 = 2 x 23 - 1: one padding row on rank 1
    per_rank = 23
    local = torch.zeros(per_rank, w.shape[1], dtype=w.dtype)
    rows = w[rank * per_rank : (rank + 1) * per_rank]
    local[: len(rows)] = rows
    cols, g_cols = token_columns(t, vocab=45)  # ids on both ranks in each row: each rank's onehot terms are partial
    lp, ent, gh, gw = grads_of(lambda h, w_: token_log_probs(h, w_, cols, 0.7, True, vocab_start=rank * per_rank, vocab_size=45,
                                                             group=torch.distributed.group.WORLD), h, local, g_cols, g_ent)
    stats = token_log_probs(h, local, t, 0.7, vocab_start=rank * per_rank, vocab_size=45, group=torch.distributed.group.WORLD,
                            with_sum_pi_squared=True, topk=4)
    torch.save({"lp": lp, "ent": ent, "gh": gh, "gw": gw[: len(rows)], "top": stats.top_log_probs, "spp": stats.sum_pi_squared,
                "lp0": stats.log_probs, "topk": stats.topk_log_probs, "topk_ids": stats.topk_ids}, f"{out}.{rank}")
    close_gloo()


def test_vocab_parallel_over_two_ranks_equals_full(tmp_path):
    out = str(tmp_path / "r")
    spawn_ranks(_shard_main, 2, lambda port: (2, port, out))
    h, w, t, g_lp, g_ent = problem(tokens=20, vocab=45)
    cols, g_cols = token_columns(t, vocab=45)
    want_lp, want_ent, want_gh, want_gw = grads_of(lambda h, w: columns_reference(h, w, cols, 0.7), h, w, g_cols, g_ent)
    want_topk, want_ids = full_logits(h, w, 0.7).log_softmax(-1).topk(4)  # over both shards, padding row excluded
    parts = [torch.load(f"{out}.{r}") for r in range(2)]
    for p in parts:
        torch.testing.assert_close(p["lp"].double(), want_lp.double(), **TOL)
        torch.testing.assert_close(p["lp0"].double(), want_lp[:, 0].double(), **TOL)
        torch.testing.assert_close(p["topk"], want_topk, **TOL)
        assert torch.equal(p["topk_ids"], want_ids)
        torch.testing.assert_close(p["ent"].double(), want_ent.double(), **TOL)
        torch.testing.assert_close(p["gh"], want_gh, **TOL)  # summed over both vocabulary shards
        torch.testing.assert_close(p["top"].double(), ((h @ w.t()).float() / 0.7).log_softmax(-1).max(-1).values.double(), **TOL)
        torch.testing.assert_close(p["spp"].double(), sum_pi_squared_reference(h, w, 0.7), **TOL)
    torch.testing.assert_close(torch.cat([p["gw"] for p in parts]), want_gw, **TOL)


def test_stacked_channels_unstack_by_name_even_through_a_models_scale():
    """stack_channels' `[*shape, 4 + (C-1) + 2K]` comes apart by name (unstack_channels): the scalar channels, the
    extra token columns, the top-k log-probs and ids. Ids divided by a head's scale and multiplied back by the model
    (TokenHead) come back exact up to 2**21 - 1. The stack is a new tensor, not a view (FSDP2 hooks it)."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 2 ** 21, (6, 2), generator=g)
    ids[0, 0] = 2 ** 21 - 1
    stats = TokenStats(torch.randn(6, 3, generator=g), torch.rand(6, generator=g), -torch.rand(6, generator=g), None,
                       -torch.rand(6, 2, generator=g), ids)
    out = stack_channels(stats, torch.Size([2, 3]))
    assert out.shape == (2, 3, 4 + 2 + 2 * 2) and out._base is None
    request = SimpleNamespace(temperature=1.0, entropy=True, sum_pi_squared=False, topk=2, gather="teacher_ids")
    for stacked in (out, (out / 0.3) * 0.3):
        named = unstack_channels(stacked, request)
        assert set(named) == {"log_probs", "entropy", "top_log_probs", "gathered_log_probs", "topk_log_probs", "topk_ids"}
        torch.testing.assert_close(named["log_probs"], stats.log_probs[:, 0].view(2, 3))
        torch.testing.assert_close(named["entropy"], stats.entropy.view(2, 3))
        torch.testing.assert_close(named["top_log_probs"], stats.top_log_probs.view(2, 3))
        torch.testing.assert_close(named["gathered_log_probs"], stats.log_probs[:, 1:].view(2, 3, 2))
        torch.testing.assert_close(named["topk_log_probs"], stats.topk_log_probs.view(2, 3, 2))
        assert torch.equal(named["topk_ids"], ids.view(2, 3, 2))
    plain = stack_channels(TokenStats(torch.randn(6), None, -torch.rand(6), torch.rand(6)), torch.Size([6]))
    named = unstack_channels(plain, SimpleNamespace(temperature=1.0, entropy=False, sum_pi_squared=True))
    assert plain.shape == (6, 4) and set(named) == {"log_probs", "top_log_probs", "sum_pi_squared"}
    with pytest.raises(AssertionError):  # extra columns that no request asked for
        unstack_channels(out, SimpleNamespace(temperature=1.0, entropy=True, sum_pi_squared=False, topk=2))


def test_the_hf_head_returns_token_columns_and_top_k_through_the_models_logit_scale(tiny_model_dir):
    """TokenHead with `[batch, k, C]` tokens and topk: the model's `.logits` unstack to what token_log_probs gives
    on its final hidden states, also when the forward scales its head's output by a config value (the ids survive
    the round trip); a scale fitted to no config value cannot carry ids exactly and is refused for topk."""
    from rlcore.models.hf import TokenHead, load_causal_lm

    model = load_causal_lm(tiny_model_dir).eval()
    head = TokenHead(model)
    g = torch.Generator().manual_seed(5)
    vocab = model.config.vocab_size
    ids, cols = torch.randint(0, vocab, (2, 6), generator=g), torch.randint(0, vocab, (2, 6, 3), generator=g)
    request = SimpleNamespace(temperature=0.7, entropy=True, sum_pi_squared=False, topk=4, gather="teacher_ids")
    forward = model.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 0.3
        return out

    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state.reshape(12, -1)
        for scale in (1.0, 0.3):
            if scale != 1.0:
                model.config.logit_scale, model.forward = scale, scaled
                head.calibrate(model, torch.device("cpu"))
                assert head.scale == scale
            with head.computing(cols, request):
                named = unstack_channels(model(input_ids=ids, use_cache=False).logits, request)
            want = token_log_probs(hidden, model.lm_head.weight, cols.reshape(12, 3), 0.7, True, scale=scale, topk=4)
            torch.testing.assert_close(named["log_probs"], want.log_probs[:, 0].view(2, 6), **TOL)
            torch.testing.assert_close(named["gathered_log_probs"], want.log_probs[:, 1:].view(2, 6, 2), **TOL)
            torch.testing.assert_close(named["topk_log_probs"], want.topk_log_probs.view(2, 6, 4), **TOL)
            assert torch.equal(named["topk_ids"], want.topk_ids.view(2, 6, 4))
        del model.config.logit_scale  # now 0.3 is no config value: the scale is a fit
        head.calibrate(model, torch.device("cpu"))
        assert not head.scale_exact
        with head.computing(cols, request), pytest.raises(ValueError, match="topk=0"):
            model(input_ids=ids, use_cache=False)
