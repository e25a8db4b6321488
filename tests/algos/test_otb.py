"""The optimal token baseline (rlcore/algos/otb.py) against verl's compute_optimal_token_baseline_advantage and its
multi-turn form, written out one group and one position at a time; verl's variance-proxy metrics; the config rules;
and the trainer handing the old-log-prob pass's sum_pi_squared (and the IS weights) to the estimator."""

import numpy as np
import pytest
import torch

from rlcore.algos import compute_advantage
from rlcore.algos.otb import variance_proxy_metrics
from rlcore.config import compose
from rlcore.config.validate import ConfigError, validate_config
from rlcore.protocol import DataProto
from rlcore.trainer.ppo import PPOTrainer

EPS = 1e-8


def _verl_otb(rewards, mask, index, old_lp, spp, is_weights, zero_tail):
    """verl's OTB: G_t = reward-to-go; w_t = (1 - 2 pi_t + sum pi^2) (x rho_t^2); W_t = cumulative masked w;
    per group of N > 1, B_t = sum_i G_it W_it m_it / (sum_i W_it m_it + eps); optionally no baseline past the
    second-longest response on a uniquely longest one; A = (G - B) m."""
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * old_lp.exp() + spp
    if is_weights is not None:
        w = w * is_weights**2
    big_w = (w * mask).cumsum(-1)
    base = torch.zeros_like(returns)
    for uid in dict.fromkeys(index):
        rows = [i for i in range(len(index)) if index[i] == uid]
        if len(rows) == 1:
            continue
        for t in range(returns.shape[1]):
            num = sum(float(returns[i, t] * big_w[i, t] * mask[i, t]) for i in rows)
            den = sum(float(big_w[i, t] * mask[i, t]) for i in rows) + EPS
            for i in rows:
                base[i, t] = num / den
        if zero_tail:
            lengths = sorted((int(mask[i].sum()), i) for i in rows)
            if lengths[-1][0] > lengths[-2][0]:
                base[lengths[-1][1], lengths[-2][0]:] = 0.0
    return (returns - base) * mask, returns


def _verl_tir_otb(rewards, mask, index, old_lp, spp, is_weights, zero_tail):
    """verl's multi-turn OTB: the same on each row's own tokens moved to the front (mask holes = tool output),
    the advantages moved back to where those tokens sit."""
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * old_lp.exp() + spp
    if is_weights is not None:
        w = w * is_weights**2
    big_w = (w * mask).cumsum(-1)
    lengths = mask.sum(-1).long()
    width = int(lengths.max())
    own_w, own_g = torch.zeros(len(mask), width, dtype=rewards.dtype), torch.zeros(len(mask), width, dtype=rewards.dtype)
    for i in range(len(mask)):
        keep = mask[i].bool()
        own_w[i, : lengths[i]], own_g[i, : lengths[i]] = big_w[i, keep], returns[i, keep]
    base = torch.zeros_like(own_g)
    for uid in dict.fromkeys(index):
        rows = [i for i in range(len(index)) if index[i] == uid and lengths[i] > 0]
        if len(rows) < 2:
            continue
        b_star = (own_g[rows] * own_w[rows]).sum(0) / (own_w[rows].sum(0) + EPS)
        base[rows] = b_star
        if zero_tail:
            by_length = sorted((int(lengths[i]), i) for i in rows)
            if by_length[-1][0] > by_length[-2][0]:
                base[by_length[-1][1], by_length[-2][0]:] = 0.0
    adv = torch.zeros_like(returns)
    for i in range(len(mask)):
        adv[i, mask[i].bool()] = (own_g[i] - base[i])[: lengths[i]]
    return adv, returns


def _batch(seed, holes=False):
    """12 samples of width 7 in groups of 4, 4, 3 and 1, with varied lengths (and, with holes, tool tokens)."""
    g = torch.Generator().manual_seed(seed)
    n, width = 12, 7
    lengths = torch.tensor([7, 5, 3, 6, 2, 7, 7, 4, 5, 1, 6, 3])
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    if holes:  # tool output in the middle of some responses
        mask[0, 2:4] = 0
        mask[5, 1] = 0
        mask[7, 1:3] = 0
    rewards = torch.zeros(n, width, dtype=torch.float64)
    rewards[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=g).double()
    rewards[3, 2] = 0.3  # a process reward in the middle
    old_lp = -torch.rand(n, width, generator=g, dtype=torch.float64) * 3
    spp = torch.rand(n, width, generator=g, dtype=torch.float64) * 0.5
    index = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 3 + ["d"], dtype=object)
    return rewards, mask, index, old_lp, spp


@pytest.mark.parametrize("zero_tail", [False, True])
@pytest.mark.parametrize("with_is", [False, True])
def test_otb_equals_verls_formula(zero_tail, with_is):
    rewards, mask, index, old_lp, spp = _batch(0)
    is_w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 if with_is else None
    got = compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask, index=index,
                            old_log_probs=old_lp, sum_pi_squared=spp, rollout_is_weights=is_w, handle_zero_tail=zero_tail)
    want = _verl_otb(rewards, mask, index, old_lp, spp, is_w, zero_tail)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    # The group of one gets no baseline: its advantage is its reward-to-go
    torch.testing.assert_close(got[0][11], got[1][11] * mask[11])


@pytest.mark.parametrize("zero_tail", [False, True])
def test_multi_turn_otb_equals_verls_formula_on_the_policys_own_tokens(zero_tail):
    rewards, mask, index, old_lp, spp = _batch(2, holes=True)
    got = compute_advantage("tir_optimal_token_baseline", token_level_rewards=rewards, response_mask=mask, index=index,
                            old_log_probs=old_lp, sum_pi_squared=spp, handle_zero_tail=zero_tail)
    want = _verl_tir_otb(rewards, mask, index, old_lp, spp, None, zero_tail)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert (got[0][mask == 0] == 0).all()


def test_equal_path_weights_make_the_baseline_the_group_mean_of_the_reward_to_go():
    """Two samples, one outcome reward each, every score norm 1 (pi = 0.25, sum pi^2 = 0.5): W_t = t + 1 for both,
    so B_t is the plain mean of the rewards-to-go and the advantages are +-0.5."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.ones(2, 3)
    adv, returns = compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                                     index=np.array(["p", "p"], dtype=object), old_log_probs=torch.full((2, 3), np.log(0.25)),
                                     sum_pi_squared=torch.full((2, 3), 0.5))
    torch.testing.assert_close(adv, torch.tensor([[0.5] * 3, [-0.5] * 3]))
    torch.testing.assert_close(returns, torch.tensor([[1.0] * 3, [0.0] * 3]))


def _verl_variance_proxy(adv, mask, old_lp, spp, is_w, grad_norm):
    """verl's compute_variance_proxy_metrics, written out."""
    w = 1 - 2 * old_lp.exp() + spp
    if is_w is not None:
        w = w * is_w**2
    a = (adv * mask).sum(-1) / mask.sum(-1)
    big_w = (w * mask).sum(-1)
    if is_w is not None:
        rho = (is_w * mask).sum(-1) / mask.sum(-1)
        w0 = ((w / (is_w**2).clamp(min=1e-10)) * mask).sum(-1).clamp(min=0)
        p2 = float((rho**2 * a**2 * w0).mean())
    else:
        p2 = float((a**2 * big_w.clamp(min=0)).mean())
    p1 = grad_norm**2
    return {"proxy1_signal_strength": p1, "proxy2_total_power": p2, "proxy3_pure_noise": max(0.0, (p2 - p1) / (len(a) - 1)),
            "expected_a_squared": float((a**2).mean()), "expected_w": float(big_w.mean())}


@pytest.mark.parametrize("with_is", [False, True])
def test_variance_proxy_metrics_are_verls(with_is):
    rewards, mask, index, old_lp, spp = _batch(3)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * mask
    is_w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2 if with_is else None
    got = variance_proxy_metrics(adv, mask, old_lp, spp, is_w, grad_norm=0.3)
    want = _verl_variance_proxy(adv, mask, old_lp, spp, is_w, 0.3)
    assert got == pytest.approx({f"variance_proxy/{k}": v for k, v in want.items()}, rel=1e-9)


OTB = ["algorithm.adv_estimator=optimal_token_baseline"]


def test_otb_needs_the_sum_of_squared_probabilities_and_the_old_log_prob_pass():
    assert validate_config(compose(["recipe=tiny_cpu", *OTB, "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]))
    with pytest.raises(ConfigError, match=r"the sum comes from the old-log-prob pass only when actor_rollout_ref.actor.calculate_sum_pi_squared=True"):
        validate_config(compose(["recipe=tiny_cpu", *OTB]))
    with pytest.raises(ConfigError, match=r"needs the old-log-prob pass .*bypass_mode=True skips"):
        validate_config(compose(["recipe=tiny_cpu", *OTB, "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
                                 "algorithm.rollout_correction.bypass_mode=True"]))


def test_the_trainer_hands_the_old_log_prob_pass_and_is_weights_to_the_estimator():
    """PPOTrainer.compute_advantage passes old_log_probs, sum_pi_squared and rollout_is_weights (computed first, by
    correct_rollout, as in verl); and calculate_sum_pi_squared turns the on-policy skip of that pass off."""
    overrides = ["recipe=tiny_cpu", *OTB, "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]
    trainer = PPOTrainer(compose(overrides), groups={"actor_rollout": None}, reward_fn=None, val_reward_fn=None, train_loader=None,
                         val_loader=None, tracker=None, total_steps=1)
    assert not trainer.on_policy  # tiny_cpu's single update is on-policy (test_ppo_controller.py) but for the flag
    rewards, mask, index, old_lp, spp = _batch(6)
    is_w = torch.full(mask.shape, 0.5, dtype=torch.float64)
    batch = DataProto.from_dict({"token_level_scores": rewards, "response_mask": mask, "old_log_probs": old_lp,
                                 "sum_pi_squared": spp, "rollout_is_weights": is_w})
    batch.non_tensor_batch["uid"] = index
    trainer.compute_advantage(batch)
    want, _ = _verl_otb(rewards, mask, index, old_lp, spp, is_w, False)
    torch.testing.assert_close(batch.batch["advantages"], want)
