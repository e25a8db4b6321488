"""Hand-computed expectations for the outcome estimators beyond GRPO and for GAE."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlcore.algos import compute_advantage
from rlcore.algos.advantages import masked_whiten


def outcome(scores, lengths):
    """token_level_rewards with each score on the last valid token, and the response mask."""
    width = max(lengths)
    rewards, mask = torch.zeros(len(scores), width), torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        rewards[i, n - 1], mask[i, :n] = s, 1
    return rewards, mask


def adv(name, scores, lengths, uids, **kw):
    rewards, mask = outcome(scores, lengths)
    a, r = compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=np.array(uids, dtype=object), **kw)
    assert torch.equal(a * (1 - mask), torch.zeros_like(a))  # nothing outside the response
    return a, r, mask


def test_rloo_leave_one_out_and_singleton():
    a, _, _ = adv("rloo", [1.0, 0.0, 0.0, 0.5], [2, 1, 3, 2], ["a", "a", "a", "b"])
    # a: mean of the others = 0 for the first, 0.5 for the other two; b alone keeps its score
    assert a[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5, 0.5])


def test_reinforce_plus_plus_discounted_returns_then_whitened():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    a, returns = compute_advantage("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, index=None,
                                   config=OmegaConf.create({"gamma": 0.5}))
    assert returns.tolist() == [[0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]
    valid = torch.tensor([0.5, 1.0, 0.0, 0.0, 0.0])  # mean 0.3, unbiased var 0.2
    expected = (valid - 0.3) / (0.2 + 1e-8) ** 0.5
    assert a[mask.bool()].tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens():
    a, _, mask = adv("reinforce_plus_plus_baseline", [1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1], ["a", "a", "b", "b"])
    # centred: [0.5, -0.5, 0, 0]; whitened with mean 0 and unbiased std sqrt(0.5/3)
    assert a[:, 0].tolist() == pytest.approx([0.5 / (0.5 / 3) ** 0.5, -0.5 / (0.5 / 3) ** 0.5, 0.0, 0.0], abs=1e-5)


def test_opo_length_weighted_baseline():
    a, _, _ = adv("opo", [1.0, 0.0], [2, 3], ["a", "a"])
    assert a[:, 0].tolist() == pytest.approx([1.0 - 0.4, -0.4])  # baseline (2*1 + 3*0) / 5


def test_grpo_passk_rewards_only_the_best_sample():
    a, _, _ = adv("grpo_passk", [1.0, 0.5, 0.0], [1, 1, 1], ["a"] * 3)
    assert a[:, 0].tolist() == pytest.approx([0.5 / (0.5 + 1e-6), 0.0, 0.0])  # gap 0.5 / group std 0.5
    a, _, _ = adv("grpo_passk", [1.0, 0.5, 0.0], [1, 1, 1], ["a"] * 3, norm_adv_by_std_in_grpo=False)
    assert a[:, 0].tolist() == pytest.approx([0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        adv("grpo_passk", [1.0], [1], ["a"])


def test_gpg_scales_by_batch_over_nonzero_scores():
    a, _, _ = adv("gpg", [1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1], ["a", "a", "b", "b"])
    assert a[:, 0].tolist() == pytest.approx([0.5 * 4 / 3, -0.5 * 4 / 3, 0.0, 0.0])


def test_gae_hand_computed_with_mask():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    gae = lambda r, v, m, gamma, lam: compute_advantage(  # noqa: E731
        "gae", token_level_rewards=r, values=v, response_mask=m, index=None, config=OmegaConf.create({"gamma": gamma, "lam": lam}))
    a, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=1: delta = 1 - 0.6 = 0.4 (nothing after the response); t=0: delta = 0.9*0.6 - 0.5 = 0.04, A = 0.04 + 0.45*0.4
    raw = torch.tensor([[0.22, 0.4, 0.0]])
    torch.testing.assert_close(returns, torch.tensor([[0.72, 1.0, 0.0]]))
    torch.testing.assert_close(a, masked_whiten(raw, mask) * mask)
    a, returns = gae(torch.tensor([[0.0, 0.0, 1.0]]), values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.ones(1, 3))  # gamma = lam = 1: Monte-Carlo return
    torch.testing.assert_close(a, torch.tensor([[1.0, 0.0, -1.0]]), atol=1e-5, rtol=0)  # raw [0.5, 0.4, 0.3] whitened


def test_gae_without_values_says_the_critic_is_needed():
    with pytest.raises(ValueError, match="critic"):
        compute_advantage("gae", token_level_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2), values=None,
                          config=OmegaConf.create({"gamma": 1.0, "lam": 1.0}))


def test_remax_subtracts_the_greedy_score_from_the_return_to_go():
    rewards, mask = outcome([1.0, 0.0], [2, 3])
    rewards[0, 0] = 0.5  # a process reward on an earlier token: return-to-go differs per token
    a, returns = compute_advantage("remax", token_level_rewards=rewards, response_mask=mask, reward_baselines=torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="greedy"):
        compute_advantage("remax", token_level_rewards=rewards, response_mask=mask, reward_baselines=None)
