"""The actor's side of rollout correction. On hand-made log-probs (no model): IS weights scale each token's
policy loss and its gradient, and without an old-log-prob pass the actor measures the mismatch itself. On a tiny
FSDP2 engine: what rejection sampling's holes in the response mask do to the loss, its gradients and the step."""

import math

import pytest
import torch
from dist_utils import assert_split_invariant, free_port, init_gloo, make_rollout_batch, split_rows
from omegaconf import OmegaConf

from rlcore.config.algorithm_schema import RolloutCorrectionConfig
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob, make_policy_loss_fn, update_policy
from rlcore.workers.common import mini_batch_counts

ACTOR = OmegaConf.create({"policy_loss": {"loss_mode": "vanilla"}, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                          "loss_agg_mode": "token-mean", "entropy_coeff": 0.0, "use_kl_loss": False, "loss_scale_factor": None})
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


# ------------------------------------------------------------------ rejected tokens on a tiny FSDP2 engine
# Rejection (rollout_rs) hands the update a response mask with holes. A micro-batch, or a whole mini-batch, may
# then have no valid token: its normalisers are 0 and an unguarded loss would be 0/0 = NaN. The old log-probs below
# are the engine's own (ratio 1), so each kept token's vanilla loss is -A and every expected value is hand-made.

ENGINE_ACTOR = {"policy_loss": {"loss_mode": "vanilla"}, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                "loss_agg_mode": "token-mean", "entropy_coeff": 0.0, "use_kl_loss": False, "loss_scale_factor": None,
                "ppo_mini_batch_size": 2, "ppo_epochs": 1, "shuffle": False, "router_replay": {"mode": "disabled"}}


def new_engine(model_dir):
    return FSDP2Engine(EngineSpec(model_path=model_dir, lr=1e-3), torch.device("cpu"))


@pytest.fixture
def engine(tiny_model_dir):
    init_gloo(0, 1, free_port())  # a 1-rank group: FSDP2 needs one; torn down by conftest
    return new_engine(tiny_model_dir)


def on_policy_batch(engine, rows, seed):
    """A rollout batch whose old log-probs are the engine's own: ratio 1, each kept token's loss is -A."""
    data = DataProto.from_dict(make_rollout_batch(rows, 6, 5, engine.hf_config.vocab_size, seed=seed))
    data.batch["old_log_probs"] = compute_log_prob(engine, data, MicroBatchSpec(rows=4), 1.0, with_entropy=False).batch["log_probs"]
    return data


def grads(engine):
    return [p.grad.full_tensor() for p in engine.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_a_micro_batch_without_valid_tokens_adds_exactly_zero(engine, mode):
    data = on_policy_batch(engine, 8, seed=5)
    kept = torch.tensor([[0, 0, 0, 0, 0],  # rows 0-1, the first micro-batch below: every token rejected
                         [0, 0, 0, 0, 0],
                         [1, 0, 0, 0, 0],
                         [1, 0, 1, 1, 0],
                         [0, 1, 1, 1, 0],
                         [0, 0, 0, 0, 0],  # a whole sequence rejected in a micro-batch that keeps others
                         [1, 1, 1, 0, 0],
                         [1, 1, 1, 0, 0]])
    assert torch.equal(kept * data.batch["response_mask"], kept)  # only sampled tokens are rejected
    data.batch["response_mask"] = kept
    keep = kept.float()
    adv = data.batch["advantages"][:, 0]
    rows = keep.sum(-1) > 0
    assert (rows.sum(), keep.sum()) == (5, 13)
    expected = {  # the mini-batch loss in one piece: rejected rows count nowhere (as verl)
        "token-mean": -(adv[:, None] * keep).sum() / keep.sum(),
        "token-sum": -(adv[:, None] * keep).sum(),
        "seq-mean-token-mean": -adv[rows].mean(),
        "seq-mean-token-sum": -(adv * keep.sum(-1)).sum() / 5,
        "seq-mean-token-sum-norm": -(adv * keep.sum(-1)).sum() / (5 * 5),  # 5 sequences x horizon 5
    }[mode]
    counts = mini_batch_counts(kept, engine)
    assert counts == (13.0, 5.0)
    loss_fn = make_policy_loss_fn(OmegaConf.create({**ENGINE_ACTOR, "loss_agg_mode": mode}), counts, 1)
    per_micro = engine.forward_backward(split_rows(data, [2, 3, 3]), loss_fn)
    assert per_micro[0]["actor/pg_loss"] == 0.0  # the empty micro-batch: 0, not NaN
    assert sum(m["actor/pg_loss"] for m in per_micro) == pytest.approx(expected.item(), abs=1e-5)
    assert all(torch.isfinite(g).all() for g in grads(engine))
    engine.optimizer.zero_grad(set_to_none=True)
    # ... and the micro-batch split, empty one included, changes neither loss nor gradients.
    assert_split_invariant(engine, [split_rows(data, [8]), split_rows(data, [2, 3, 3]), split_rows(data, [2, 2, 2, 2])],
                           loss_fn, "actor/pg_loss")


def test_the_guarded_loss_of_a_fully_rejected_mini_batch_is_zero_with_zero_gradients(engine):
    """What the update never runs (see the next test), still safe if called: counts (0, 0) divide as 1."""
    data = on_policy_batch(engine, 4, seed=6)
    data.batch["response_mask"].zero_()
    counts = mini_batch_counts(data.batch["response_mask"], engine)
    assert counts == (0.0, 0.0)
    for mode in ("token-mean", "seq-mean-token-mean"):
        loss_fn = make_policy_loss_fn(OmegaConf.create({**ENGINE_ACTOR, "loss_agg_mode": mode}), counts, 1)
        per_micro = engine.forward_backward(split_rows(data, [2, 2]), loss_fn)
        assert [m["actor/pg_loss"] for m in per_micro] == [0.0, 0.0]
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(engine))
        engine.optimizer.zero_grad(set_to_none=True)


def test_a_fully_rejected_mini_batch_is_skipped_and_the_update_is_as_without_it(engine, tiny_model_dir):
    data = on_policy_batch(engine, 8, seed=7)
    data.batch["response_mask"][:4] = 0  # the first mini-batch (4 rows = 2 prompts x n=2): every token rejected
    kept = data.index(list(range(4, 8)))
    cfg = OmegaConf.create(ENGINE_ACTOR)
    metrics = update_policy(engine, data, cfg, MicroBatchSpec(rows=2), rollout_n=2, temperature=1.0)

    reference = new_engine(tiny_model_dir)  # the same initial weights, updated on the second mini-batch alone
    alone = update_policy(reference, kept, cfg, MicroBatchSpec(rows=2), rollout_n=2, temperature=1.0)

    assert engine.optimizer_steps == 2  # the lr schedule counts the skipped step
    assert (metrics["actor/empty_mini_batches"], metrics["actor/skipped_steps"]) == (0.5, 0.5)
    assert (alone["actor/empty_mini_batches"], alone["actor/skipped_steps"]) == (0.0, 0.0)
    assert alone["actor/grad_norm"] > 0 and metrics["actor/grad_norm"] == pytest.approx(alone["actor/grad_norm"] / 2)  # mean of 0 and it
    adv, keep = kept.batch["advantages"], kept.batch["response_mask"].float()
    assert metrics["actor/pg_loss"] == alone["actor/pg_loss"] == pytest.approx((-(adv * keep).sum() / keep.sum()).item(), abs=1e-5)
    # No AdamW step on the empty mini-batch (a zero-gradient step would still decay the weights): the same weights
    # and optimizer state as an update that never saw it.
    for p, r in zip(engine.model.parameters(), reference.model.parameters()):
        assert torch.equal(p.full_tensor(), r.full_tensor())
    steps = {float(s["step"]) for s in engine.optimizer.state.values()}
    assert steps == {1.0}


def test_an_update_whose_every_token_was_rejected_changes_nothing(engine):
    data = on_policy_batch(engine, 4, seed=8)
    data.batch["response_mask"].zero_()
    before = [p.full_tensor().clone() for p in engine.model.parameters()]
    metrics = update_policy(engine, data, OmegaConf.create(ENGINE_ACTOR), MicroBatchSpec(rows=2), rollout_n=2, temperature=1.0)
    assert metrics == {"actor/empty_mini_batches": 1.0, "actor/grad_norm": 0.0, "actor/lr": 1e-3, "actor/skipped_steps": 1.0}
    assert all(torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))
    assert not engine.optimizer.state and engine.optimizer_steps == 1


def test_bypass_mode_rejecting_every_token_in_the_forward_gives_loss_zero_and_zero_gradients(engine):
    """bypass_mode rejects inside the forward (from this forward's ratio), after the counts are taken: its
    normaliser is the mini-batch's count before rejection (verl's global batch_num_tokens alike), so a fully
    rejected mini-batch is a zero loss and an all-zero gradient (grad_norm 0), not a skipped step."""
    data = on_policy_batch(engine, 4, seed=9)
    # As the controller hands bypass_mode over: the rollout's log-probs are the old ones; rho = e^5 > 2 on every token.
    data.batch["old_log_probs"] = data.batch["rollout_log_probs"] = data.batch["old_log_probs"] - 5.0
    rc = RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold=2.0, bypass_mode=True)
    loss_fn = make_policy_loss_fn(OmegaConf.create(ENGINE_ACTOR), mini_batch_counts(data.batch["response_mask"], engine), 1,
                                  rollout_corr=rc)
    per_micro = engine.forward_backward(split_rows(data, [2, 2]), loss_fn)
    assert [m["actor/pg_loss"] for m in per_micro] == [0.0, 0.0]
    assert sum(m["rollout_corr/rollout_rs_masked_fraction"] for m in per_micro) == pytest.approx(1.0)  # the share is logged
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(engine))
    assert engine.optimizer_step()["grad_norm"] == 0.0
