"""The policy update is exact under gradient accumulation: micro-batch splits do not change gradients."""

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch
from omegaconf import OmegaConf

from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob, make_policy_loss_fn, update_policy
from rlcore.workers.common import mini_batch_counts

ACTOR = {
    "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
                    "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},  # every knob, as the schema passes them
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
    "entropy_coeff": 0.0, "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.05,
    "ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4, "ppo_epochs": 1,
}


@pytest.fixture
def engine(tiny_model_dir):
    init_gloo(0, 1, free_port())  # a 1-rank group: FSDP2 needs one; torn down by conftest
    return FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-3), torch.device("cpu"))


def grads_for(engine, data, splits, mode):
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": mode})
    loss_fn = make_policy_loss_fn(cfg, mini_batch_counts(data.batch["response_mask"], torch.device("cpu")), 1, 5, 1.0)
    parts, start = [], 0
    for size in splits:
        parts.append(data.index(list(range(start, start + size))))
        start += size
    metrics = engine.forward_backward(parts, loss_fn)
    grads = [p.grad.full_tensor().clone() for p in engine.model.parameters()]
    engine.optimizer.zero_grad(set_to_none=True)
    return grads, sum(m["actor/pg_loss"] for m in metrics)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_splits_give_identical_gradients(engine, mode):
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, engine.hf_config.vocab_size, seed=3))
    reference, ref_loss = grads_for(engine, data, [8], mode)
    for splits in ([2, 2, 2, 2], [1, 3, 4], [5, 1, 1, 1]):  # 4 even and 3-4 uneven micro-batches
        grads, loss = grads_for(engine, data, splits, mode)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        for g, r in zip(grads, reference):
            torch.testing.assert_close(g, r, atol=1e-7, rtol=1e-5)


def test_update_policy_steps_once_per_mini_batch_and_reports_metrics(engine):
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, engine.hf_config.vocab_size, seed=4))
    # old_log_probs from the current policy: the first update starts on-policy (ratio 1, no clipping).
    data.batch["old_log_probs"] = compute_log_prob(engine, data, 4, 1.0, with_entropy=False).batch["log_probs"]
    before = [p.full_tensor().clone() for p in engine.model.parameters()]
    cfg = OmegaConf.create({**ACTOR, "loss_agg_mode": "token-mean"})
    metrics = update_policy(engine, data, cfg, rollout_n=2, temperature=1.0, dp_size=1, device=torch.device("cpu"))
    assert engine.scheduler.last_epoch == 2  # 8 rows / (2 prompts x n=2) = 2 mini-batches = 2 optimizer steps
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0
    # The first mini-batch is on-policy, the second runs after one optimizer step: the policy has moved.
    assert metrics["actor/ppo_kl"] != 0.0
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr"):  # entropy: from the log-prob pass
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert any(not torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))
