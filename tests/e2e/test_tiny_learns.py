"""The RL itself learns: starting from a briefly SFT-warm-started tiny model, GRPO raises reward and accuracy."""

import json

import numpy as np
import pytest

from rlcore.cli.prepare_tiny import SETTINGS, prepare
from rlcore.config import compose
from rlcore.train import run


@pytest.mark.slow
def test_grpo_raises_training_reward_and_held_out_accuracy(tmp_path):
    # A shorter warm-start than the demo's keeps this CI-sized and leaves more for RL to fix.
    model_dir = prepare(str(tmp_path / "assets"), {**SETTINGS, "sft_steps": 200})
    cfg = compose([
        "recipe=tiny_cpu", f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={tmp_path}/assets/data/train.parquet", f"data.val_files={tmp_path}/assets/data/test.parquet",
        f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.total_training_steps=30", "trainer.test_freq=30",
    ])
    run(cfg, str(tmp_path / "run"))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    val = [r["val-core/tiny_add/reward/mean@1"] for r in rows if "val-core/tiny_add/reward/mean@1" in r]
    assert len(scores) == 30 and len(val) == 2
    first, last = np.mean(scores[:5]), np.mean(scores[-5:])
    print(f"train reward {first:.3f} -> {last:.3f}; val accuracy {val[0]:.3f} -> {val[-1]:.3f}")
    assert last > first + 0.08
    assert val[-1] > val[0] + 0.05
