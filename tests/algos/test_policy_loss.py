import math

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
    s0, s1 = math.exp(0.3), math.exp(0.15)  # geometric means over the valid tokens (padding ignored)
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
