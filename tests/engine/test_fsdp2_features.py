"""FSDP2 engine features on one gloo rank: checkpointing, non-finite step skipping, warmup, offload."""

import math

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch

from rlcore.engine.base import EngineSpec, FSDPSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.engine.optim import lr_factor
from rlcore.protocol import DataProto

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)


def nll(outputs, mb):
    lp = outputs["log_probs"]  # the engine hands over the response tokens' log-probs
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
    engine.forward_backward([data], lambda outputs, mb: (nll(outputs, mb)[0] * float("nan"), {}))
    step = engine.optimizer_step()
    assert step["skipped_step"] == 1.0 and math.isnan(step["grad_norm"])
    assert all(torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))
    engine.forward_backward([data], nll)  # the next finite step trains normally
    assert engine.optimizer_step()["skipped_step"] == 0.0
    assert any(not torch.equal(b, p.full_tensor()) for b, p in zip(before, engine.model.parameters()))


def test_warmup_then_constant_and_cosine():
    """The first update is the schedule's step 1 (torchtitan's count, rlcore's default), or step 0 with
    optim.zero_indexed_step=True (verl's count: a warmup's first update runs at its start, optim.lr_warmup_init)."""
    constant = dict(warmup_steps=4, total_steps=10, kind="constant", min_lr_ratio=0.0, num_cycles=0.5)
    assert [lr_factor(step, **constant) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(step, **constant, zero_indexed=True) for step in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert [lr_factor(step, **constant, zero_indexed=True, init_ratio=0.2) for step in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lr_factor(9, warmup_steps=0, total_steps=10, kind="cosine", min_lr_ratio=0.1, num_cycles=0.5) == pytest.approx(0.1)
    assert lr_factor(10, warmup_steps=0, total_steps=10, kind="cosine", min_lr_ratio=0.1, num_cycles=0.5, zero_indexed=True) == pytest.approx(0.1)


def test_the_engine_steps_at_the_schedules_lr_and_a_skipped_step_still_advances_it(pg, tiny_model_dir, data):
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2, warmup_steps=2, total_steps=4), torch.device("cpu"))
    lrs = []
    for skip in (False, True, False):
        engine.forward_backward([data], nll)
        lrs.append(engine.optimizer_step(skip=skip)["lr"])
    assert lrs == pytest.approx([5e-3, 1e-2, 1e-2]) and engine.optimizer_steps == 3
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)


def test_override_optimizer_config_reaches_adamw(pg, tiny_model_dir, data):
    """optim.override_optimizer_config: AdamW keywords, on top of the ones rlcore's optim keys set."""
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2, optimizer_overrides={"eps": 1e-3, "amsgrad": True}), torch.device("cpu"))
    group = engine.optimizer.param_groups[0]
    assert (group["eps"], group["amsgrad"], group["lr"]) == (1e-3, True, 1e-2)
    engine.forward_backward([data], nll)
    engine.optimizer_step()
    assert all("max_exp_avg_sq" in state for state in engine.optimizer.state.values())  # amsgrad's extra moment


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


def test_optimizer_step_is_clipped_decoupled_adamw_by_hand(pg, tiny_model_dir):
    """Two steps of the engine's optimizer on gradients we set, against AdamW written out: clip to grad_clip by
    the global norm, m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, w <- w (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)."""
    lr, wd, clip, (b1, b2), eps = 1e-2, 0.1, 0.5, (0.9, 0.999), 1e-8
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=lr, weight_decay=wd, grad_clip=clip, betas=(b1, b2)), torch.device("cpu"))
    params = list(engine.model.parameters())
    w = [p.full_tensor().clone().double() for p in params]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    g = torch.Generator().manual_seed(0)
    for t in (1, 2):
        # Gradients well away from eps (|g| >= 0.1), so every entry's step is determined to float32 precision.
        raw = [(torch.rand(x.shape, generator=g, dtype=torch.float64) + 0.1) * torch.sign(torch.randn(x.shape, generator=g)) for x in w]
        for p, r in zip(params, raw):
            p.grad = torch.distributed.tensor.distribute_tensor(r.float(), p.device_mesh, p.placements)
        norm = torch.cat([r.flatten() for r in raw]).norm()
        step = engine.optimizer_step()
        assert step["grad_norm"] == pytest.approx(float(norm), rel=1e-5) and step["lr"] == lr
        scale = min(1.0, clip / (float(norm) + 1e-6))  # torch's clip_grad_norm_ adds 1e-6 to the norm
        for i, r in enumerate(raw):
            m[i] = b1 * m[i] + (1 - b1) * r * scale
            v[i] = b2 * v[i] + (1 - b2) * (r * scale) ** 2
            w[i] = w[i] * (1 - lr * wd) - lr * (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
    for p, expected in zip(params, w):
        torch.testing.assert_close(p.full_tensor().double(), expected, atol=2e-6, rtol=0)  # float32 vs float64 arithmetic


def test_a_frozen_model_is_stored_in_model_dtype_and_a_trained_one_in_fp32(pg, tiny_model_dir):
    """verl's reference in bf16 (ref.fsdp_config.model_dtype): frozen weights take half the memory; a trained model
    keeps fp32 masters whatever model_dtype says."""
    frozen = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, trainable=False, model_dtype="bf16"), torch.device("cpu"))
    trained = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, model_dtype="bf16"), torch.device("cpu"))
    assert {p.dtype for p in frozen.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trained.model.parameters()} == {torch.float32}
    assert frozen.state_bytes()["params"] * 2 == trained.state_bytes()["params"]
    assert frozen.state_bytes()["grads"] == frozen.state_bytes()["optimizer"] == 0


def test_activation_offload_keeps_each_checkpointed_block_input_as_a_host_copy(pg, tiny_model_dir, data, monkeypatch):
    """model.enable_activation_offload. On a CPU device host and device are one memory, so rlcore copies nothing
    there; here the copy is forced (as on CUDA, unpinned) to show that every checkpointed block keeps a host copy
    of its input, and that backward through the copies gives the same gradients."""
    from rlcore.engine import activation_offload

    plain = grads(FSDP2Engine(EngineSpec(model_path=tiny_model_dir, gradient_checkpointing=True), torch.device("cpu")), data)
    copies = []
    monkeypatch.setattr(activation_offload, "to_host", lambda t: copies.append(activation_offload.copy_to_host(t, pin=False)) or copies[-1])
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, gradient_checkpointing=True, fsdp=FSDPSpec(activation_offload=True)), torch.device("cpu"))
    for a, b in zip(plain, grads(engine, data)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)
    layers, hidden = engine.hf_config.num_hidden_layers, engine.hf_config.hidden_size
    rows, seq = data.batch["input_ids"].shape
    # One copy per block per forward, each [rows, seq, hidden] fp32: what leaves the device on CUDA.
    assert [tuple(c.shape) for c in copies] == [(rows, seq, hidden)] * layers
    assert sum(c.numel() * c.element_size() for c in copies) == layers * rows * seq * hidden * 4


def test_a_checkpoint_from_before_the_shared_schedule_resumes_at_its_step(pg, tiny_model_dir, tmp_path):
    """FSDP2 checkpoints once held torch's LambdaLR state in scheduler.pt: its last_epoch is the step count."""
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2, warmup_steps=4, total_steps=8), torch.device("cpu"))
    torch.save({"base_lrs": [1e-2], "last_epoch": 3, "_step_count": 4, "_last_lr": [1e-2]}, tmp_path / "scheduler.pt")
    engine._load_schedule(str(tmp_path), frozenset({"extra"}))
    assert engine.optimizer_steps == 3 and engine.learning_rate() == pytest.approx(1e-2)
    engine.optimizer_steps = 5
    engine._save_schedule(str(tmp_path), frozenset({"extra"}))
    assert torch.load(tmp_path / "scheduler.pt") == {"optimizer_steps": 5}
