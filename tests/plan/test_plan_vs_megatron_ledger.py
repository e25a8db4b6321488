"""The memory plan's Megatron state against the engine's own account of a real 2-rank CPU run (TP2, bf16 weights).

megatron-core cannot run the rehearsal's fake tensors (rlcore.cli.rehearsal says why), so its terms are checked
here: per rank, the plan's bf16 weights / TP, the fp32 gradient buffer / TP and the fp32 master + AdamW moments
against `MegatronEngine.state_bytes()` after its first optimizer step.
"""

import json

import pytest
from dist_utils import close_gloo, init_gloo, spawn_ranks

from rlcore.config import compose
from rlcore.config.validate import diagnose
from rlcore.plan.arch import resolve_arch
from rlcore.plan.memory import GIB, Estimator

pytest.importorskip("megatron.core")

OVERRIDES = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
             "actor_rollout_ref.actor.megatron.dtype=bfloat16"]


def config(model_dir):
    return compose([f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES], config_name="ppo_megatron_trainer")


def _ledger(rank, port, model_dir, out):
    import torch

    from rlcore.engine.factory import build_engine, engine_spec

    init_gloo(rank, 2, port)
    arr = config(model_dir).actor_rollout_ref
    engine = build_engine("megatron", engine_spec("megatron", arr.model, arr.actor, arr.actor.optim, 1.0, 1), torch.device("cpu"))
    engine.optimizer_step()  # Adam creates its moments at the first step (the fp32 master copy exists from the build)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(engine.state_bytes(), f)
    close_gloo()


def test_the_plans_megatron_state_is_the_engines_within_10_percent(tiny_model_dir, tmp_path):
    out = tmp_path / "ledger.json"
    spawn_ranks(_ledger, 2, lambda port: (port, tiny_model_dir, str(out)))
    ledger = {kind: nbytes / GIB for kind, nbytes in json.loads(out.read_text()).items()}
    cfg = config(tiny_model_dir)
    plan, _ = diagnose(cfg)
    est = Estimator(cfg, plan, 80.0, "cpu")
    state = est.state(est.training_role("actor update", resolve_arch(tiny_model_dir)[0], "actor", 2))
    # The engine pads the vocabulary to a multiple of 128 x TP (the plan does not): a few % on a tiny model's embedding.
    for planned, kind in (("weights", "params"), ("grads", "grads"), ("optim", "optimizer")):
        assert abs(state[planned] - ledger[kind]) <= 0.10 * ledger[kind], (kind, state[planned], ledger[kind])
