"""The tiny demo on a mixture of experts (recipe tiny_cpu_moe: a Qwen3-MoE of the demo's width, 8 experts, top-2,
its own SFT warm-start): GRPO with router replay R3 raises held-out accuracy, and the train-vs-rollout mismatch
(`rollout_corr/*`, the training forward's log-probs against the rollout's for the same tokens) with R3 against
without. A feature's learning demo: `make test-demos` runs it (docs/contributing.md)."""

import os

import numpy as np
import pytest
from test_tiny_learns import train_demo

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.demo]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def moe_assets() -> str:
    """Where `make train-moe` keeps them, built once (about a minute) and reused by settings stamp."""
    from rlcore.cli.prepare_tiny import MOE_SETTINGS, prepare

    out = os.path.join(REPO, ".cache", "tiny_cpu_moe")
    prepare(out, MOE_SETTINGS)
    return out


def test_grpo_with_r3_on_a_tiny_moe_raises_held_out_accuracy(moe_assets, tmp_path):
    val, rows = train_demo(moe_assets, tmp_path, "tiny_cpu_moe", STEPS)
    scores = [r["critic/score/mean"] for r in rows]
    balance = [r["actor/moe/load_max_over_mean"] for r in rows]
    print(f"MoE + R3: val accuracy {val[0]:.3f} -> {val[-1]:.3f}; train reward {np.mean(scores[:10]):.3f} -> {np.mean(scores[-10:]):.3f}; "
          f"load max/mean {balance[0]:.2f} -> {balance[-1]:.2f}")
    # Measured on the 2-core AVX-512 EPYC: 0.200 -> 0.522 at step 300 (0.370 at 100, 0.588 at 400); issue 44 asks +25 points.
    assert val[-1] >= val[0] + 0.25
    assert all(1.0 <= b <= 8.0 for b in balance)


def test_r3_narrows_the_mismatch_of_a_bf16_trainer(moe_assets, tmp_path):
    """A bf16 trainer against the fp32 rollout (the GPU setting's precision gap): without replay its bf16 router picks
    other experts for some tokens; with R3 it takes the rollout's. rollout_corr/k3_kl: the token-mean k3 KL between
    the rollout's and the training forward's log-probs of the sampled tokens, per step."""
    bf16 = ("actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.ref.fsdp_config.dtype=bfloat16")
    free = ("actor_rollout_ref.actor.router_replay.mode=disabled", "actor_rollout_ref.rollout.enable_rollout_routing_replay=False")
    runs = {name: [r["rollout_corr/k3_kl"] for r in train_demo(moe_assets, tmp_path / name, "tiny_cpu_moe", MISMATCH_STEPS, *bf16, *extra)[1]]
            for name, extra in (("R3", ()), ("free", free))}
    print({name: f"k3_kl mean {np.mean(v):.2e} max {np.max(v):.2e}" for name, v in runs.items()})
    # Measured (30 steps, EPYC): R3 mean 1.1e-4, max 1.7e-4; without replay mean 2.5e-4, max 2.8e-3.
    assert np.mean(runs["R3"]) < np.mean(runs["free"])


STEPS = 300
MISMATCH_STEPS = 30
