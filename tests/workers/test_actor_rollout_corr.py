"""The actor's side of rollout correction, on hand-made log-probs (no model): IS weights scale each token's
policy loss and its gradient, and without an old-log-prob pass the actor measures the mismatch itself."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlcore.protocol import DataProto
from rlcore.workers.actor import make_policy_loss_fn

ACTOR = OmegaConf.create({"policy_loss": {"loss_mode": "vanilla"}, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                          "loss_agg_mode": "token-mean", "entropy_coeff": 0.0, "use_kl_loss": False})
LOG_PROB = [[-1.0, -2.0], [-0.5, -1.5]]
ADV = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])


def run(on_policy, **columns):
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    batch = {"advantages": ADV, "response_mask": torch.ones(2, 2), **columns}
    if not on_policy:
        batch["old_log_probs"] = torch.tensor(LOG_PROB)  # ratio 1: each token's loss is -A
    loss_fn = make_policy_loss_fn(ACTOR, (4.0, 2.0), 1, on_policy=on_policy)
    loss, metrics = loss_fn({"log_probs": log_prob, "entropy": torch.zeros(2, 2)}, DataProto.from_dict(batch))
    loss.backward()
    return loss.item(), log_prob.grad, metrics


def test_is_weights_scale_each_tokens_loss_and_gradient():
    plain, plain_grad, _ = run(False)
    assert plain == pytest.approx(-(1 + 2 - 1 + 0.5) / 4)
    weights = torch.tensor([[2.0, 0.5], [1.0, 3.0]])
    loss, grad, _ = run(False, rollout_is_weights=weights)
    assert loss == pytest.approx(-(2 * 1 + 0.5 * 2 - 1 * 1 + 3 * 0.5) / 4)  # -0.875
    assert torch.allclose(grad, -ADV * weights / 4) and torch.allclose(plain_grad, -ADV / 4)  # d ratio / d log_prob = 1 at ratio 1


def test_without_an_old_log_prob_pass_the_actor_measures_the_mismatch():
    rollout = torch.tensor(LOG_PROB) - torch.tensor([[math.log(3), 0.0], [0.0, -math.log(4)]])  # rho = 3, 1, 1, 1/4
    _, _, m = run(True, rollout_log_probs=rollout)
    assert m["rollout_corr/kl"] == pytest.approx((-math.log(3) + math.log(4)) / 4)
    assert m["rollout_corr/k3_kl"] == pytest.approx((3 - math.log(3) - 1 + 0.25 + math.log(4) - 1) / 4)
    assert (m["rollout_corr/ratio_fraction_high"], m["rollout_corr/ratio_fraction_low"]) == (pytest.approx(0.25), pytest.approx(0.25))
    _, _, m = run(False)
    assert not any(k.startswith("rollout_corr/") for k in m)  # the controller measured it from its own pass
