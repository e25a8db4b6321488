import math

import pytest
import torch

from rlcore.algos import agg_loss, kl_penalty
from rlcore.algos.kl import AdaptiveKLController


def test_kl_estimators_hand_computed():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.allclose(kl_penalty(lp, ref, "kl"), torch.tensor([0.5, -1.0]))
    assert torch.allclose(kl_penalty(lp, ref, "abs"), torch.tensor([0.5, 1.0]))
    assert torch.allclose(kl_penalty(lp, ref, "mse"), torch.tensor([0.125, 0.5]))
    expected_k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert torch.allclose(kl_penalty(lp, ref, "low_var_kl"), torch.tensor(expected_k3))
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3").item() == 10.0  # clamped


def test_plus_variant_has_k3_value_and_k2_gradient():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    out = kl_penalty(lp, ref, "low_var_kl+")
    assert torch.allclose(out, kl_penalty(lp.detach(), ref, "k3"))
    out.sum().backward()
    assert torch.allclose(lp.grad, (lp - ref).detach())  # d/dlp of 0.5 (lp - ref)^2


def test_token_mean_over_uneven_micro_batches_equals_whole_batch():
    torch.manual_seed(0)
    loss = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.4).float()
    mask[:, 0] = 1
    whole = agg_loss(loss, mask, "token-mean")
    tokens = mask.sum().item()
    parts = [(0, 1), (1, 4), (4, 6)]  # uneven micro-batches
    summed = sum(agg_loss(loss[a:b], mask[a:b], "token-mean", global_tokens=tokens, global_seqs=6) for a, b in parts)
    assert torch.allclose(summed, whole)
    assert not torch.allclose(sum(agg_loss(loss[a:b], mask[a:b], "token-mean") for a, b in parts) / 3, whole)


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3) / 3),
    ("seq-mean-token-sum", ((1 + 2) + 3) / 2),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 3) / 2),
    ("seq-mean-token-sum-norm", ((1 + 2) + 3) / 2 / 2),
])
def test_aggregation_modes_hand_computed(mode, expected):
    loss = torch.tensor([[1.0, 2.0], [3.0, 99.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3) / 3),
    ("seq-mean-token-sum", ((1 + 2) + 3) / 2),  # the fully rejected middle row is no sample: 2 sequences, not 3
    ("seq-mean-token-mean", ((1 + 2) / 2 + 3) / 2),
])
def test_a_fully_masked_row_counts_in_no_denominator(mode, expected):
    loss = torch.tensor([[1.0, 2.0], [7.0, 8.0], [3.0, 99.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected)
    assert agg_loss(loss, torch.zeros(3, 2), mode).item() == 0.0  # nothing valid: 0, not 0/0


def test_adaptive_kl_controller_moves_towards_target():
    ctrl = AdaptiveKLController(0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=1.0, n_steps=10)  # far above target: error clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))


def test_kl_ctrl_type_picks_a_fixed_or_adaptive_coefficient():
    from rlcore.algos.kl import make_kl_controller
    from rlcore.config import compose

    def after_update(kind):
        ctrl = make_kl_controller(compose(["recipe=tiny_cpu", f"algorithm.kl_ctrl.type={kind}", "algorithm.kl_ctrl.kl_coef=0.1",
                                           "algorithm.kl_ctrl.target_kl=0.01"]).algorithm.kl_ctrl)
        ctrl.update(current_kl=1.0, n_steps=8)  # far above target: an adaptive coefficient grows
        return ctrl.value

    assert after_update("fixed") == 0.1
    assert after_update("adaptive") > 0.1
