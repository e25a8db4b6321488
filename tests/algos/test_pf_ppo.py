"""PF-PPO (rlcore/algos/pf_ppo.py) against verl's compute_pf_ppo_reweight_data, written out: the weights of each
method, the draw, and the trainer redrawing the whole batch after GAE, reproducibly per seed and step."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlcore.algos.pf_ppo import pf_ppo_rows, pf_ppo_weights
from rlcore.config import compose
from rlcore.config.validate import ConfigError, validate_config
from rlcore.protocol import DataProto
from rlcore.trainer.ppo import PPOTrainer


def _verl_weights(scores, method, weight_pow):
    """verl's compute_weights, then its clamp."""
    if method == "pow":
        w = torch.pow(torch.abs(scores), weight_pow)
    elif method == "max_min":
        w = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
    else:
        w = torch.where(scores == scores.max(), 0.4, 0.1)
    return torch.clamp(w + 1e-8, min=1e-8)


@pytest.mark.parametrize("method", ["pow", "max_min", "max_random"])
def test_weights_are_verls(method):
    scores = torch.tensor([1.0, -2.0, 0.0, 0.5, 1.0, -0.25])
    assert torch.allclose(pf_ppo_weights(scores, method, 3.0), _verl_weights(scores, method, 3.0))


def test_the_draw_follows_the_weights_and_repeats_with_its_generator():
    scores = torch.tensor([0.0, 0.0, 3.0, 0.0])  # pow: only row 2 has weight (the others 1e-8)
    rows = pf_ppo_rows(scores, "pow", 2.0, torch.Generator().manual_seed(0))
    assert rows.tolist() == [2, 2, 2, 2]
    scores = torch.randn(64)
    a, b = (pf_ppo_rows(scores, "pow", 2.0, torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(a, b) and len(a) == 64


def test_the_trainer_redraws_the_batch_after_gae_and_only_with_gae():
    cfg = compose(["recipe=tiny_cpu_ppo", "algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=max_min"])
    assert validate_config(cfg)
    n, width = 8, 4
    scores = torch.zeros(n, width)
    scores[:, -1] = torch.tensor([0.0, 1.0, 0.5, 0.5, -1.0, 0.5, 0.5, 0.5])  # max row 1, min row 4
    batch = DataProto.from_dict({"token_level_scores": scores, "response_mask": torch.ones(n, width), "values": torch.zeros(n, width),
                                 "row": torch.arange(n)})
    batch.non_tensor_batch["uid"] = np.array([f"p{i}" for i in range(n)], dtype=object)
    trainer = SimpleNamespace(cfg=cfg, global_step=3)
    metrics = PPOTrainer.compute_advantage(trainer, batch)
    assert set(batch.batch["row"].tolist()) <= {1, 4} and len(batch) == n  # max_min keeps the extremes only
    assert batch.non_tensor_batch["uid"].tolist() == [f"p{i}" for i in batch.batch["row"].tolist()]  # rows move whole
    assert metrics["pf_ppo/unique_sample_fraction"] <= 2 / n
    with pytest.raises(ConfigError, match=r"use_pf_ppo=True redraws the batch after GAE .*algorithm.adv_estimator=grpo it would do nothing"):
        validate_config(compose(["recipe=tiny_cpu", "algorithm.use_pf_ppo=True"]))
