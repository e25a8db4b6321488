import functools
import math

import pytest
import torch

from rlcore.algos import POLICY_LOSSES


def test_vanilla_clip_and_dual_clip_hand_computed():
    loss_fn = POLICY_LOSSES.get("vanilla")
    old = torch.zeros(1, 4)
    # ratios e^0.5 (above 1.2), e^-0.5, 1.0, e^2 (huge, negative advantage -> dual clip at c=3)
    new = torch.tensor([[0.5, -0.5, 0.0, 2.0]])
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0]])
    loss, stats = loss_fn(old, new, adv, torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    expected = [
        -1.0 * 1.2,                       # positive A, ratio clipped at 1 + eps
        -1.0 * math.exp(-0.5),            # positive A, ratio below 1 - eps: unclipped term is larger
        2.0 * 1.0,                        # negative A, ratio 1
        min(max(1.0 * math.exp(2.0), 1.0 * 1.2), 3.0),  # negative A: PPO gives e^2, dual clip caps at c * |A| = 3
    ]
    assert torch.allclose(loss, torch.tensor([expected]), atol=1e-6)
    assert stats["actor/pg_clipfrac"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert stats["actor/pg_clipfrac_lower"].tolist() == [[0.0, 0.0, 0.0, 1.0]]


def test_vanilla_gradient_is_zero_when_clipped():
    new = torch.tensor([[0.5]], requires_grad=True)
    loss, _ = POLICY_LOSSES.get("vanilla")(torch.zeros(1, 1), new, torch.ones(1, 1), torch.ones(1, 1))
    loss.sum().backward()
    assert new.grad.item() == 0.0


def test_gspo_uses_the_sequence_ratio_with_per_token_gradient():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.3, 0.0, 0.6], [0.3, 0.0, 9.9]], requires_grad=True)  # row 1: padding after 2 tokens
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    loss, stats = POLICY_LOSSES.get("gspo")(old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    s1 = math.exp(0.15)  # row 1's geometric mean over its valid tokens (padding ignored); row 0's is e^0.3
    # row 0: A > 0 and s0 = 1.35 > 1.2 -> clipped at -1.2; row 1: A < 0, -A s1 = 1.16 beats -A * 1.16 (inside)
    assert torch.allclose(loss[0], torch.full((3,), -1.2)) and torch.allclose(loss[1, :2], torch.full((2,), s1))
    assert stats["actor/pg_clipfrac"][0].tolist() == [1.0, 1.0, 1.0]
    (loss * mask).sum().backward()
    assert new.grad[0].abs().max() == 0.0  # clipped: no gradient
    assert torch.allclose(new.grad[1, :2], torch.full((2,), s1))  # d(-A s)/d log_prob_t = -A s per token


def test_gpg_is_plain_policy_gradient():
    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = POLICY_LOSSES.get("gpg")(torch.zeros(1, 2), new, torch.tensor([[2.0, -1.0]]), torch.ones(1, 2))
    assert loss.tolist() == [[2.0, -2.0]]
    loss.sum().backward()
    assert new.grad.tolist() == [[-2.0, 1.0]]


def test_cispo_weights_log_prob_by_the_truncated_ratio():
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, stats = POLICY_LOSSES.get("cispo")(torch.zeros(1, 3), new, adv, torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=0.2)
    weights = [1.2, 0.8, 1.1]  # ratios 1.5 and 0.5 truncated to 1 +- 0.2; 1.1 inside
    expected = [-a * w * math.log(r) for a, w, r in zip([1.0, -1.0, 2.0], weights, [1.5, 0.5, 1.1])]
    assert torch.allclose(loss, torch.tensor([expected]), atol=1e-6)
    loss.sum().backward()
    # Unlike PPO, the truncated tokens keep a gradient: -A * weight.
    assert torch.allclose(new.grad, torch.tensor([[-1.2, 0.8, -2.2]]))
    assert stats["actor/pg_clipfrac"].tolist() == [[1.0, 0.0, 0.0]]
    assert stats["actor/pg_clipfrac_lower"].tolist() == [[0.0, 1.0, 0.0]]


# 4 valid tokens, advantages with mean 0 and log-probs with mean -1.275: covariances
# (A - 0)(logp + 1.275) = [3 * 1.175, -3 * -1.725, 0, 0] = [3.525, 5.175, 0, 0].
COV_ADV = torch.tensor([[3.0, -3.0, 0.0, 0.0]])
COV_LOGP = [[-0.1, -3.0, -1.0, -1.0]]


def test_clip_cov_zeroes_the_loss_of_a_token_inside_the_covariance_band():
    new = torch.tensor(COV_LOGP, requires_grad=True)
    loss, stats = POLICY_LOSSES.get("clip_cov")(new.detach().clone(), new, COV_ADV, torch.ones(1, 4),
                                              clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0)
    # ratio 1 everywhere (nothing PPO-clipped); only token 0 has 1 < cov < 5; max(1, int(0.0002 * 4)) = 1 is dropped.
    assert torch.allclose(loss, torch.tensor([[0.0, 3.0, 0.0, 0.0]]))
    loss.sum().backward()
    assert torch.allclose(new.grad, torch.tensor([[0.0, 3.0, 0.0, 0.0]]))  # -A r for the kept tokens
    assert stats["actor/pg_clipfrac"].tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_kl_cov_penalises_the_largest_covariance_tokens():
    new = torch.tensor(COV_LOGP, requires_grad=True)
    old = new.detach() - torch.tensor([[0.0, 0.1, 0.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("kl_cov")(old, new, COV_ADV, torch.ones(1, 4), kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    # k = int(0.25 * 4) = 1 token: the largest covariance, token 1 (5.175), gets + 0.1 * |log ratio| = 0.1 * 0.1.
    expected = [[-3.0, 3.0 * math.exp(0.1) + 0.01, 0.0, 0.0]]
    assert torch.allclose(loss, torch.tensor(expected), atol=1e-6)
    none, _ = POLICY_LOSSES.get("kl_cov")(old, new, COV_ADV, torch.ones(1, 4), kl_cov_ratio=0.0002)  # k = 0: plain -A r
    assert torch.allclose(none, torch.tensor([[-3.0, 3.0 * math.exp(0.1), 0.0, 0.0]]), atol=1e-6)


def _verl_gmpo(old, new, adv, mask, eps_low, eps_high):
    """verl's compute_policy_loss_geo_mean (core_algos.py at b178a3c), transcribed: the reference."""
    d = new - old
    sgn = torch.sign(adv)
    d_clamp = torch.clamp(d, -eps_low, eps_high)
    d_min = sgn * torch.min(sgn * d, sgn * d_clamp)
    n = mask.sum(-1)
    ratio = torch.exp((d_min * mask).sum(-1) / (n + 1e-8))
    a = (adv * mask).sum(-1) / (n + 1e-8)
    return torch.mean(-a * ratio)


def test_geo_mean_is_verls_gmpo_over_sequences_whatever_the_aggregation():
    from rlcore.algos.agg import agg_loss
    from rlcore.algos.policy_loss import GMPO_AGGREGATION

    torch.manual_seed(0)
    old = torch.randn(4, 6) * 0.3 - 1.0
    new = (old + torch.randn(4, 6) * 0.5).requires_grad_()
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 2 + [0.0] * 4, [1.0] * 5 + [0.0]])
    adv = torch.tensor([1.5, -0.7, 0.0, 2.0]).unsqueeze(-1).expand(4, 6)  # GRPO: one advantage per sequence
    loss_fn = POLICY_LOSSES.get("geo_mean")
    assert loss_fn.loss_agg_mode == GMPO_AGGREGATION == "seq-mean-token-mean"
    mat, stats = loss_fn(old, new, adv, mask, clip_ratio_low=0.4, clip_ratio_high=0.4)
    ours = agg_loss(mat, mask, GMPO_AGGREGATION)  # one micro-batch holding the whole mini-batch
    reference = _verl_gmpo(old, new.detach().requires_grad_(), adv, mask, 0.4, 0.4)
    assert torch.allclose(ours, reference, atol=1e-6)
    ours.backward()
    ref_new = new.detach().clone().requires_grad_()
    _verl_gmpo(old, ref_new, adv, mask, 0.4, 0.4).backward()
    assert torch.allclose(new.grad, ref_new.grad, atol=1e-6)  # the same gradient, token by token
    # the clip fraction counts tokens whose log-ratio left [-0.4, 0.4], by the advantage's sign
    outside = ((new - old).abs() > 0.4).float()
    assert torch.equal(stats["actor/pg_clipfrac"], (outside * (adv > 0)).detach())


def _verl_sapo(old, new, adv, mask, tau_pos, tau_neg):
    """SAPO as verl's compute_policy_loss_sapo computes it, written out from the paper's formula: a per-token gate
    sigmoid(tau (r - 1)) * 4 / tau on the ratio, tau by the advantage's sign, then the mean over each sequence's
    tokens and over sequences."""
    r = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    per_token = -adv * torch.sigmoid(tau * (r - 1.0)) * 4.0 / tau
    per_sequence = (per_token * mask).sum(-1) / mask.sum(-1)
    return per_sequence.mean()


def test_sapo_is_verls_smooth_gate_over_sequences():
    """actor.policy_loss.loss_mode=sapo with actor.tau_pos / actor.tau_neg (verl's keys and defaults, 1.0 / 1.05)."""
    from rlcore.algos.agg import agg_loss
    from rlcore.algos.policy_loss import SAPO_AGGREGATION
    from rlcore.config import compose
    from rlcore.workers.actor import policy_loss_params

    actor = compose(["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=0.8",
                     "actor_rollout_ref.actor.tau_neg=1.3"]).actor_rollout_ref.actor
    params = policy_loss_params(actor)
    assert (params["tau_pos"], params["tau_neg"]) == (0.8, 1.3)
    # verl 0.9's SAPO scripts add them under policy_loss (`+...policy_loss.tau_pos`): set there, they win
    v09 = compose(["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=0.8",
                   "+actor_rollout_ref.actor.policy_loss.tau_pos=0.9", "+actor_rollout_ref.actor.policy_loss.tau_neg=1.1"])
    assert {k: policy_loss_params(v09.actor_rollout_ref.actor)[k] for k in ("tau_pos", "tau_neg")} == {"tau_pos": 0.9, "tau_neg": 1.1}
    torch.manual_seed(0)
    old = torch.randn(4, 6) * 0.3 - 1.0
    new = (old + torch.randn(4, 6) * 0.5).requires_grad_()
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 2 + [0.0] * 4, [1.0] * 5 + [0.0]])
    adv = torch.tensor([1.5, -0.7, 0.0, 2.0]).unsqueeze(-1).expand(4, 6)
    loss_fn = POLICY_LOSSES.get("sapo")
    assert loss_fn.loss_agg_mode == SAPO_AGGREGATION == "seq-mean-token-mean"
    mat, stats = loss_fn(old, new, adv, mask, **params)
    ours = agg_loss(mat, mask, SAPO_AGGREGATION)
    ref_new = new.detach().clone().requires_grad_()
    reference = _verl_sapo(old, ref_new, adv, mask, 0.8, 1.3)
    assert torch.allclose(ours, reference, atol=1e-6)
    ours.backward()
    reference.backward()
    assert torch.allclose(new.grad, ref_new.grad, atol=1e-6)
    assert not stats["actor/pg_clipfrac"].any()  # a gate, no clip
    # at ratio 1 the gate's slope is 1: the gradient is the policy gradient's, -A per token, for either temperature
    at_one = old.clone().requires_grad_()
    loss_fn(old, at_one, adv, mask, **params)[0].sum().backward()
    assert torch.allclose(at_one.grad, -adv)



# ------------------------------------------------------------------------------------------------ verl 0.9's DPPO, DRO
# verl's formulas written out per token from its core_algos.py (dppo_tv, dppo_kl, dro), aggregated token-mean over
# the whole batch as its agg_loss does for one mini-batch; float64, values and gradients against rlcore's functions.


def _verl_dppo(old, new, adv, mask, low, high, c, kind):
    r = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    p, p_old = torch.exp(new), torch.exp(old)
    if kind == "tv":
        keep = torch.where(adv > 0, (p - p_old) <= high, (p - p_old) >= -low)
    else:
        d = p_old * (old - new) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        keep = torch.where(adv > 0, (d <= high) | (p <= p_old), (d <= low) | (p >= p_old))
    keep = keep.detach().double()
    per_token = -adv * torch.clamp(r, max=c).detach() * new * keep
    return (per_token * mask).sum() / mask.sum(), ((1 - keep) * mask).sum() / mask.sum()


def _verl_dro(old, new, adv, mask, beta):
    return (-(new * adv - 0.5 * beta * (new - old) ** 2) * mask).sum() / mask.sum(), None


def _random_case(seed, batch, length):
    """Log-probs across (0, 1) in probability, moved by up to ~1 nat (some tokens leave any trust region), advantages
    of both signs and some zeros, ragged masks (one row fully masked)."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(batch, length, generator=g, dtype=torch.float64) * 0.98 + 0.01)
    new = (old + torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.6).clamp(max=-1e-3)
    adv = torch.randn(batch, 1, generator=g, dtype=torch.float64).expand(batch, length).clone()
    adv[0] = 0.0
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).double()
    mask[-1] = 0.0
    return old, new, adv, mask


def _parity(loss_name, reference, params, seed, batch, length):
    """(value diff, gradient diff, the reference's (loss, extra), our stats, the mask) of rlcore's loss, aggregated
    token-mean, against `reference` on one random case."""
    from rlcore.algos.agg import agg_loss

    old, new, adv, mask = _random_case(seed, batch, length)
    ours_new, ref_new = new.clone().requires_grad_(), new.clone().requires_grad_()
    mat, stats = POLICY_LOSSES.get(loss_name)(old, ours_new, adv, mask, **params)
    ours = agg_loss(mat, mask, "token-mean")
    want = reference(old, ref_new, adv, mask)
    ours.backward()
    want[0].backward()
    return (ours - want[0]).abs().item(), (ours_new.grad - ref_new.grad).abs().max().item(), want, stats, mask


@functools.lru_cache(maxsize=None)
def _loss_params(*overrides):
    """policy_loss_params of the actor section composed with `overrides` (each composition once per module)."""
    from rlcore.config import compose
    from rlcore.workers.actor import policy_loss_params

    return policy_loss_params(compose(list(overrides)).actor_rollout_ref.actor)


@pytest.mark.parametrize("kind", ["tv", "kl"])
@pytest.mark.parametrize("seed,batch,length", [(0, 5, 7), (1, 16, 3), (2, 3, 33)])
def test_dppo_is_verls_divergence_masked_policy_gradient(kind, seed, batch, length):
    """loss_mode=dppo_tv / dppo_kl read actor.clip_ratio_low / clip_ratio_high (as divergence thresholds) and
    actor.clip_ratio_c (the truncated ratio's bound), as verl's do."""
    from rlcore.algos.agg import agg_loss

    params = _loss_params(f"actor_rollout_ref.actor.policy_loss.loss_mode=dppo_{kind}", "actor_rollout_ref.actor.clip_ratio_low=0.1",
                          "actor_rollout_ref.actor.clip_ratio_high=0.15", "actor_rollout_ref.actor.clip_ratio_c=1.5")
    reference = lambda o, n, a, m: _verl_dppo(o, n, a, m, 0.1, 0.15, 1.5, kind)  # noqa: E731
    value_diff, grad_diff, (_, clipfrac), stats, mask = _parity(f"dppo_{kind}", reference, params, seed, batch, length)
    assert value_diff < 1e-12 and grad_diff < 1e-12
    assert agg_loss(stats["actor/pg_clipfrac"], mask, "token-mean").item() == pytest.approx(clipfrac.item(), abs=1e-12)
    assert 0 < clipfrac < 1  # the case reaches both sides of the trust region


def test_dppo_drops_only_moves_the_advantage_pushes_too_far():
    """By hand: p_old = 0.5; A > 0 keeps a token that fell (any amount) or rose by <= delta_high; A < 0 mirrors it."""
    old = torch.log(torch.full((1, 4), 0.5, dtype=torch.float64))
    new = torch.log(torch.tensor([[0.6, 0.9, 0.1, 0.9]], dtype=torch.float64))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    _, stats = POLICY_LOSSES.get("dppo_tv")(old, new, adv, torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert stats["actor/pg_clipfrac"].tolist() == [[0.0, 1.0, 1.0, 0.0]]  # +0.1 kept, +0.4 dropped, -0.4 dropped, +0.4 kept
    _, stats = POLICY_LOSSES.get("dppo_kl")(old, new, adv, torch.ones(1, 4), clip_ratio_low=0.05, clip_ratio_high=0.05)
    assert stats["actor/pg_clipfrac"].tolist() == [[0.0, 1.0, 1.0, 0.0]]  # binary KL 0.02 kept; 0.51 (up or down) dropped


@pytest.mark.parametrize("seed,batch,length", [(3, 5, 7), (4, 16, 3), (5, 3, 33)])
def test_dro_is_verls_penalised_policy_gradient(seed, batch, length):
    """loss_mode=dro with actor.policy_loss.dro_beta: -(A log_prob - beta / 2 (log_prob - old)^2), no clip."""
    params = _loss_params("actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.3")
    assert params["dro_beta"] == 0.3
    value_diff, grad_diff, _, stats, _ = _parity("dro", lambda o, n, a, m: _verl_dro(o, n, a, m, 0.3), params, seed, batch, length)
    assert value_diff < 1e-12 and grad_diff < 1e-12
    assert set(stats) == {"actor/ppo_kl"}  # verl's dro logs only the KL
    with pytest.raises(ValueError, match="dro_beta=None must be > 0"):
        POLICY_LOSSES.get("dro")(*_random_case(seed, batch, length), dro_beta=None)


def test_dro_needs_a_positive_beta_before_the_run_and_only_with_dro():
    from rlcore.config import compose
    from rlcore.config.validate import diagnose

    beta = "actor_rollout_ref.actor.policy_loss.dro_beta"
    errors = diagnose(compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.policy_loss.loss_mode=dro"]))[1]
    assert [e for e in errors if e.startswith(f"{beta}=None must be > 0 with actor_rollout_ref.actor.policy_loss.loss_mode=dro")
            and f"{beta}=0.1" in e], errors
    errors = diagnose(compose(["recipe=tiny_cpu", f"+{beta}=0.1"]))[1]  # verl's scripts' "+" form composes
    assert errors == [f"{beta}=0.1 is read only by actor_rollout_ref.actor.policy_loss.loss_mode=dro; set loss_mode=dro, or drop {beta}"]
