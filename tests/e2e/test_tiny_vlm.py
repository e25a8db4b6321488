"""The vision-language demo (`make train-vlm`; in `make test-demos`, in vLLM's venv on vLLM's rollout, the harder
path: the demo itself runs the native engine): a tiny Qwen2.5-VL whose warm-start answers a colour's name without
looking (SFT on shuffled answers) learns with GRPO to read the colour off the image: held-out greedy accuracy rises
by 20 points or more."""

import json
import os

import numpy as np
import pytest

from rlcore.config import compose
from rlcore.train import run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VAL = "val-core/tiny_colour/reward/mean@1"


@pytest.mark.demo
@pytest.mark.vllm
def test_grpo_teaches_a_vision_language_model_to_look(tmp_path):
    from rlcore.cli.prepare_tiny_vlm import prepare

    assets = os.path.join(REPO, ".cache", "tiny_vlm")
    prepare(assets)  # cached where `make train-vlm` keeps it
    cfg = compose(["recipe=tiny_cpu_vlm", f"actor_rollout_ref.model.path={assets}/sft_model", f"data.train_files={assets}/data/train.parquet",
                   f"data.val_files={assets}/data/test.parquet", f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=-1",
                   "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.enforce_eager=true"])
    run(cfg, str(tmp_path / "run"))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    val = [r[VAL] for r in rows if VAL in r]
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    print(f"held-out accuracy by test: {', '.join(f'{v:.3f}' for v in val)}; train reward {np.mean(scores[:10]):.3f} -> "
          f"{np.mean(scores[-10:]):.3f}")
    # Measured (2-core EPYC): 0.273 -> 0.727 after 100 steps (256 held-out images: +-3 points of noise).
    assert val[-1] >= val[0] + 0.20
    assert max(r["rollout/log_prob_abs_diff"] for r in rows if "rollout/log_prob_abs_diff" in r) < 1e-4
