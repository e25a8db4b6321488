"""Hand-computed clipped value loss and explained variance."""

import pytest
import torch

from rlcore.algos.value import clipped_value_loss, explained_variance


def test_clipped_value_loss_hand_computed():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    vpreds = torch.tensor([[1.0, 0.3, -1.0]], requires_grad=True)
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    loss, stats = clipped_value_loss(vpreds, old, returns, cliprange_value=0.5)
    # token 0: V=1 clipped to 0.5 -> max((1-2)^2, (0.5-2)^2) = 2.25, the clipped term wins (no gradient)
    # token 1: inside the range: (0.3-1)^2 = 0.49 both ways
    # token 2: V=-1 clipped to -0.5 -> max(1, 0.25) = 1, the unclipped term wins
    torch.testing.assert_close(loss, torch.tensor([[0.5 * 2.25, 0.5 * 0.49, 0.5 * 1.0]]))
    assert stats["critic/vf_clipfrac"].tolist() == [[1.0, 0.0, 0.0]]
    loss.sum().backward()
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 0.3 - 1.0, -1.0]]))  # d 0.5 (V-R)^2 = V - R


def test_explained_variance_ignores_padding():
    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0, abs=1e-6)
    # residual [0.5, 0.5, -0.5, -0.5]: var 0.25 against var(returns) 1.25
    assert explained_variance(returns + torch.tensor([[0.5, 0.5, 0], [-0.5, -0.5, 0]]), returns, mask) == pytest.approx(0.8)
