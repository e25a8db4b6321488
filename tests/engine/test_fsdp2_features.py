"""FSDP2 engine features on one gloo rank: checkpointing, non-finite step skipping, warmup, offload."""

import math

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch

from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.engine.optim import warmup_schedule
from rlcore.models.logits import gather_log_probs
from rlcore.protocol import DataProto


def nll(logits, mb):
    lp = gather_log_probs(logits, mb.batch["responses"])  # the engine hands over response-aligned logits
    mask = mb.batch["response_mask"]
    return -(lp * mask).sum() / mask.sum(), {}


@pytest.fixture
def data():
    return DataProto.from_dict(make_rollout_batch(6, 6, 5, 100, seed=1))


@pytest.fixture
def pg():
    init_gloo(0, 1, free_port())


def grads(engine, data):
    engine.forward_backward([data], nll)
    out = [p.grad.full_tensor().clone() for p in engine.model.parameters()]
    engine.optimizer.zero_grad(set_to_none=True)
    return out


def test_gradient_checkpointing_gives_identical_gradients(pg, tiny_model_dir, data):
    plain = grads(FSDP2Engine(EngineSpec(model_path=tiny_model_dir), torch.device("cpu")), data)
    ckpt_engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, gradient_checkpointing=True), torch.device("cpu"))
    assert getattr(ckpt_engine.model, "is_activation_checkpointing", None) or ckpt_engine.model.is_gradient_checkpointing
    for a, b in zip(plain, grads(ckpt_engine, data)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_non_finite_gradient_step_is_skipped(pg, tiny_model_dir, data):
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2), torch.device("cpu"))
    before = [p.full_tensor().clone() for p in engine.model.parameters()]
    engine.forward_backward([data], lambda logits, mb: (nll(logits, mb)[0] * float("nan"), {}))
    step = engine.optimizer_step()
    assert step["skipped_step"] == 1.0 and math.isnan(step["grad_norm"])
    assert all(torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))
    engine.forward_backward([data], nll)  # the next finite step trains normally
    assert engine.optimizer_step()["skipped_step"] == 0.0
    assert any(not torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))


def test_warmup_then_constant_and_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_schedule(opt, warmup_steps=4, total_steps=10, kind="constant", min_lr_ratio=0.0, num_cycles=0.5)
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cosine = warmup_schedule(opt, warmup_steps=0, total_steps=10, kind="cosine", min_lr_ratio=0.1, num_cycles=0.5)
    for _ in range(10):
        opt.step()
        cosine.step()
    assert cosine.get_last_lr()[0] == pytest.approx(0.1)


def test_offload_onload_round_trip_keeps_training_identical(pg, tiny_model_dir, data):
    ref = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2), torch.device("cpu"))
    off = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2, param_offload=True, optimizer_offload=True), torch.device("cpu"))
    for engine in (ref, off):
        for _ in range(2):
            engine.forward_backward([data], nll)
            engine.optimizer_step()
            if engine is off:
                engine.offload()
                assert all(p.device.type == "cpu" for p in engine.model.parameters())
                engine.onload()
    for a, b in zip(ref.model.parameters(), off.model.parameters()):
        torch.testing.assert_close(a.full_tensor(), b.full_tensor())
