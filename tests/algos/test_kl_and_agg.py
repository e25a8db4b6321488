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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_sum_over_ranks_and_micro_batches_is_verls_global_token_sum(seed):
    """loss_agg_mode=token-sum (verl 0.9): one mini-batch's loss is the sum of the loss over all its valid tokens.
    Here 2 data-parallel ranks, each with uneven micro-batches: each micro-batch's share summed per rank (gradient
    accumulation), the ranks averaged (data-parallel gradient reduction), equals that sum in value and gradient."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 11, 6
    loss = torch.randn(rows, width, generator=g, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(rows, width, generator=g) > 0.3).double()
    mask[3] = 0.0  # a fully rejected row
    tokens, seqs = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    ranks = [[(0, 2), (2, 3), (3, 6)], [(6, 10), (10, 11)]]  # (row start, row end) of each micro-batch, per rank
    per_rank = [sum(agg_loss(loss[a:b], mask[a:b], "token-sum", tokens, seqs, dp_size=2) for a, b in micro) for micro in ranks]
    ours = sum(per_rank) / len(per_rank)
    (ours_grad,) = torch.autograd.grad(ours, loss)
    verl = (loss * mask).sum()  # verl's global semantics: masked_sum x dp_size per rank, averaged over ranks
    (verl_grad,) = torch.autograd.grad(verl, loss)
    assert (ours - verl).abs().item() < 1e-12 and (ours_grad - verl_grad).abs().max().item() < 1e-12


def test_under_token_sum_the_actor_sums_the_loss_and_its_statistics_stay_means():
    """The actor's loss with loss_agg_mode=token-sum is the token sum; its clip fraction stays a fraction (verl logs
    the loss's statistics as masked means whatever the aggregation), not a count that grows with the batch."""
    from omegaconf import OmegaConf

    from rlcore.protocol import DataProto
    from rlcore.workers.actor import make_policy_loss_fn

    actor = OmegaConf.create({"policy_loss": {"loss_mode": "vanilla"}, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                              "clip_ratio_c": 3.0, "loss_agg_mode": "token-sum", "entropy_coeff": 0.0, "use_kl_loss": False,
                              "loss_scale_factor": None})
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 9.0]])  # one token clipped (ratio e^0.5 > 1.2, A > 0); one padding
    adv, mask = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    batch = DataProto.from_dict({"advantages": adv, "response_mask": mask, "old_log_probs": old})
    loss, metrics = make_policy_loss_fn(actor, (5.0, 2.0), 1)({"log_probs": new, "entropy": torch.zeros(2, 3)}, batch)
    assert loss.item() == pytest.approx(-(1.2 + 1 + 1 + 1 + 1))
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(1 / 5)


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3) / 3),
    ("token-sum", 1 + 2 + 3),
    ("seq-mean-token-sum", ((1 + 2) + 3) / 2),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 3) / 2),
    ("seq-mean-token-sum-norm", ((1 + 2) + 3) / 2 / 2),
])
def test_aggregation_modes_hand_computed(mode, expected):
    loss = torch.tensor([[1.0, 2.0], [3.0, 99.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected)


def test_loss_scale_factor_is_dr_grpos_divisor_in_place_of_the_response_width():
    """verl 0.9's <role>.loss_scale_factor: seq-mean-token-sum-norm divides each sequence's token sum by it (None: the
    batch's response width), from the config to the actor's loss."""
    from rlcore.config import compose
    from rlcore.protocol import DataProto
    from rlcore.workers.actor import make_policy_loss_fn

    loss = torch.tensor([[1.0, 2.0], [3.0, 99.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=8).item() == pytest.approx((1 + 2 + 3) / 2 / 8)
    assert agg_loss(loss, mask, "token-mean", loss_scale_factor=8).item() == pytest.approx(2.0)  # other modes ignore it
    actor = compose(["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "actor_rollout_ref.actor.loss_scale_factor=8",
                     "actor_rollout_ref.actor.use_kl_loss=False"]).actor_rollout_ref.actor
    log_probs = torch.zeros(2, 2)
    batch = DataProto.from_dict({"advantages": -loss, "response_mask": mask, "old_log_probs": log_probs})
    value, _ = make_policy_loss_fn(actor, (3.0, 2.0), 1)({"log_probs": log_probs, "entropy": torch.zeros(2, 2)}, batch)
    assert value.item() == pytest.approx((1 + 2 + 3) / 2 / 8)  # at ratio 1 the PPO loss is -A per token


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
