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
