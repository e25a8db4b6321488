"""The policy update is exact under gradient accumulation: micro-batch splits (fixed or by token budget) do not
change gradients, and token-budget passes return outputs in the batch's order."""

import pytest
import torch
from dist_utils import assert_split_invariant, free_port, init_gloo, make_rollout_batch, split_rows
from omegaconf import OmegaConf
from transformers import AutoConfig

from rlcore.data.micro_batches import MicroBatchSpec, make_micro_batches
from rlcore.data.seqlen_balancing import budget_partitions
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob, make_policy_loss_fn, update_policy
from rlcore.workers.common import mini_batch_counts

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)

ACTOR = {
    "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
                    "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},  # every knob, as the schema passes them
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
    "entropy_coeff": 0.0, "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.05, "router_replay": {"mode": "disabled"},
    "ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4, "ppo_epochs": 1, "shuffle": False,
    "loss_scale_factor": None,
}


@pytest.fixture
def engine(tiny_model_dir):
    init_gloo(0, 1, free_port())  # a 1-rank group: FSDP2 needs one; torn down by conftest
    return FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-3), torch.device("cpu"))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_splits_give_identical_gradients(engine, mode):
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, engine.hf_config.vocab_size, seed=3))
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": mode})
    loss_fn = make_policy_loss_fn(cfg, mini_batch_counts(data.batch["response_mask"], engine), 1)
    # 1, 4 even and 3-4 uneven micro-batches
    sets = [split_rows(data, sizes) for sizes in ([8], [2, 2, 2, 2], [1, 3, 4], [5, 1, 1, 1])]
    assert_split_invariant(engine, sets, loss_fn, "actor/pg_loss")


def test_update_policy_steps_once_per_mini_batch_and_reports_metrics(engine):
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, engine.hf_config.vocab_size, seed=4))
    # old_log_probs from the current policy: the first update starts on-policy (ratio 1, no clipping).
    data.batch["old_log_probs"] = compute_log_prob(engine, data, MicroBatchSpec(rows=4), 1.0, with_entropy=False).batch["log_probs"]
    before = [p.full_tensor().clone() for p in engine.model.parameters()]
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": "token-mean"})
    metrics = update_policy(engine, data, cfg, MicroBatchSpec(rows=4), rollout_n=2, temperature=1.0)
    assert engine.optimizer_steps == 2  # 8 rows / (2 prompts x n=2) = 2 mini-batches = 2 optimizer steps
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0
    # The first mini-batch is on-policy, the second runs after one optimizer step: the policy has moved.
    assert metrics["actor/ppo_kl"] != 0.0
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr"):  # entropy: from the log-prob pass
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert any(not torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))


def budget_for(data, num_parts, packed):
    """The smallest token budget whose micro-batches number exactly `num_parts`."""
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    for budget in range(max(lengths), sum(lengths) * max(lengths) + 1):
        if len(budget_partitions(lengths, budget, packed)) == num_parts:
            return budget
    raise AssertionError(f"no budget gives {num_parts} micro-batches")


@pytest.mark.parametrize("packed", [False, True])
def test_token_mean_loss_is_the_same_over_1_3_or_7_token_budget_micro_batches(tiny_model_dir, packed):
    init_gloo(0, 1, free_port())
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, use_remove_padding=packed, lr=1e-3), torch.device("cpu"))
    data = DataProto.from_dict(make_rollout_batch(16, 6, 12, engine.hf_config.vocab_size, seed=8))
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": "token-mean"})
    loss_fn = make_policy_loss_fn(cfg, mini_batch_counts(data.batch["response_mask"], engine), 1)
    sets = []
    for num_parts in (1, 3, 7):
        parts, _ = make_micro_batches(data, MicroBatchSpec(max_tokens=budget_for(data, num_parts, packed), packed=packed))
        assert len(parts) == num_parts and (num_parts == 1 or len({len(p) for p in parts}) > 1)  # uneven
        sets.append(parts)
    assert_split_invariant(engine, sets, loss_fn, "actor/pg_loss")


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_log_probs_come_back_in_the_batch_order(engine, tiny_model_dir, packed):
    data = DataProto.from_dict(make_rollout_batch(12, 6, 9, engine.hf_config.vocab_size, seed=9))
    fixed = compute_log_prob(engine, data, MicroBatchSpec(rows=12), 1.0, with_entropy=True)
    other = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, use_remove_padding=packed), torch.device("cpu"))
    dynamic = compute_log_prob(other, data, MicroBatchSpec(max_tokens=40, packed=packed), 1.0, with_entropy=True)
    mask = data.batch["response_mask"].bool()
    for key in ("log_probs", "entropys"):
        assert dynamic.batch[key].shape == (12, 9)
        torch.testing.assert_close(dynamic.batch[key][mask], fixed.batch[key][mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_an_on_policy_update_without_the_old_log_prob_pass_is_the_same_update(tiny_model_dir, entropy_coeff):
    """One mini-batch, one epoch: the controller skips the old-log-prob pass and the loss uses its own log-probs,
    detached. Same loss, metrics and weights as with the pass (to float32 noise: the pass and the update forward
    are separate computations), and actor/entropy is the batch's token mean as the pass would have logged."""
    init_gloo(0, 1, free_port())
    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    rows = {k: v for k, v in make_rollout_batch(8, 6, 5, vocab, seed=5).items() if k != "old_log_probs"}
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": "seq-mean-token-mean", "ppo_mini_batch_size": 4, "entropy_coeff": entropy_coeff})
    results = []
    for with_pass in (True, False):
        torch.manual_seed(0)
        engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-3), torch.device("cpu"))
        batch = DataProto.from_dict(dict(rows), meta_info={"on_policy": not with_pass})  # the controller's decision
        if with_pass:
            old = compute_log_prob(engine, batch, MicroBatchSpec(rows=3), 1.0, with_entropy=True)
            mask = batch.batch["response_mask"]
            pass_entropy = ((old.batch["entropys"] * mask).sum() / mask.sum()).item()
            batch.batch["old_log_probs"] = old.batch["log_probs"]
        else:  # what a rollout engine returned for its samples: here 0.25 off the update's own log-probs per token
            batch.batch["rollout_log_probs"] = (old.batch["log_probs"] + 0.25) * batch.batch["response_mask"]
        metrics = update_policy(engine, batch, cfg, MicroBatchSpec(rows=3), rollout_n=2, temperature=1.0)
        results.append((metrics, [p.full_tensor().clone() for p in engine.model.parameters()]))
    (with_metrics, with_weights), (without_metrics, without_weights) = results
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert without_metrics[key] == pytest.approx(with_metrics[key], abs=1e-6), key
    assert without_metrics["actor/ppo_kl"] == 0.0 and without_metrics["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert "rollout/log_prob_abs_diff" not in with_metrics
    assert without_metrics["rollout/log_prob_abs_diff"] == pytest.approx(0.25, abs=1e-5)  # token mean over the mini-batch
    assert without_metrics["actor/grad_norm"] == pytest.approx(with_metrics["actor/grad_norm"], rel=1e-5)
    assert without_metrics["actor/entropy"] == pytest.approx(pass_entropy if entropy_coeff == 0 else with_metrics["actor/entropy"], rel=1e-5)
    for a, b in zip(with_weights, without_weights):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # lr 1e-3: Adam moves each weight <= ~1e-3; noise far below
    with pytest.raises(ValueError, match="only a single on-policy step"):
        update_policy(engine, DataProto.from_dict(dict(rows), meta_info={"on_policy": True}), OmegaConf.merge(cfg, {"ppo_mini_batch_size": 2}),
                      MicroBatchSpec(rows=3), rollout_n=2, temperature=1.0)
    with pytest.raises(ValueError, match="but old_log_probs are not in the batch"):  # no decision, no pass: refused
        update_policy(engine, DataProto.from_dict(dict(rows)), cfg, MicroBatchSpec(rows=3), rollout_n=2, temperature=1.0)


def test_kl_loss_coef_and_kl_loss_type_weigh_and_pick_the_kl_term():
    """The actor's loss adds kl_loss_coef x the kl_loss_type estimate of KL(actor || reference) (verl's use_kl_loss)."""
    from rlcore.algos.kl import kl_penalty
    from rlcore.config import compose

    torch.manual_seed(0)
    log_prob, ref_log_prob = -torch.rand(2, 3), -torch.rand(2, 3)
    mb = DataProto.from_dict({"response_mask": torch.ones(2, 3), "advantages": torch.zeros(2, 3), "old_log_probs": log_prob.clone(),
                              "ref_log_prob": ref_log_prob})

    def loss(*overrides):
        actor = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0",
                         *[f"actor_rollout_ref.actor.{o}" for o in overrides]]).actor_rollout_ref.actor
        value, metrics = make_policy_loss_fn(actor, (6.0, 2.0), 1)({"log_probs": log_prob, "entropy": torch.zeros(2, 3)}, mb)
        return value.item(), metrics["actor/kl_loss"].item()

    # zero advantages: the policy loss is 0 and the loss is the KL term alone
    for kind in ("kl", "mse", "low_var_kl"):
        value, kl = loss("kl_loss_coef=0.5", f"kl_loss_type={kind}")
        assert kl == pytest.approx(kl_penalty(log_prob, ref_log_prob, kind).mean().item(), abs=1e-6)
        assert value == pytest.approx(0.5 * kl, abs=1e-6)
        assert loss("kl_loss_coef=2.0", f"kl_loss_type={kind}")[0] == pytest.approx(2.0 * kl, abs=1e-6)
    assert loss("kl_loss_type=kl")[1] != pytest.approx(loss("kl_loss_type=mse")[1])


def test_clip_ratio_sets_both_clip_bounds_unless_they_are_set():
    """verl's clip_ratio: the PPO epsilon; clip_ratio_low / clip_ratio_high override one side each."""
    from rlcore.config import compose
    from rlcore.workers.actor import policy_loss_params

    def bounds(*overrides):
        params = policy_loss_params(compose([f"actor_rollout_ref.actor.{o}" for o in overrides]).actor_rollout_ref.actor)
        return params["clip_ratio_low"], params["clip_ratio_high"]

    assert bounds() == (0.2, 0.2)
    assert bounds("clip_ratio=0.3") == (0.3, 0.3)
    assert bounds("clip_ratio=0.3", "clip_ratio_high=0.28") == (0.3, 0.28)


def test_gmpo_averages_its_sequence_losses_whatever_loss_agg_mode_says():
    """verl's GMPO scripts set loss_agg_mode=token-mean, which its geo_mean loss ignores: rlcore's actor does too,
    while the micro-batch losses still add up to the mini-batch's (counts are the whole mini-batch's)."""
    from rlcore.algos.policy_loss import POLICY_LOSSES
    from rlcore.config import compose

    torch.manual_seed(0)
    old = -torch.rand(4, 5)
    new = old + 0.3 * torch.randn(4, 5)
    mask = torch.tensor([[1.0] * 5, [1.0] * 2 + [0.0] * 3, [1.0] * 4 + [0.0], [1.0] * 3 + [0.0] * 2])
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0]).unsqueeze(-1).expand(4, 5).contiguous()
    actor = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                     "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.use_kl_loss=False"]).actor_rollout_ref.actor
    mat, _ = POLICY_LOSSES.get("geo_mean")(old, new, adv, mask, clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high)
    expected = mat[:, 0].mean().item()  # the mean over the 4 sequences of their loss
    fn = make_policy_loss_fn(actor, (mask.sum().item(), 4.0), 1)
    halves = [fn({"log_probs": new[i], "entropy": torch.zeros(2, 5)},
                 DataProto.from_dict({"response_mask": mask[i], "advantages": adv[i], "old_log_probs": old[i]}))[0].item()
              for i in (slice(0, 2), slice(2, 4))]
    assert sum(halves) == pytest.approx(expected, abs=1e-6)
