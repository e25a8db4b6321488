"""LoRA on the FSDP2 engine: only adapters train, the reference is the base with adapters off, the rollout gets
merged weights (all of them once, then only the adapted ones) or, without merging, the base once and then the
adapters alone, and checkpoints are peft adapters + exact resume."""

import os

import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo, make_rollout_batch, spawn_ranks, token_outputs

from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.hf import load_causal_lm, load_value_model
from rlcore.models.lora import LoraSpec, trainable_share
from rlcore.protocol import DataProto
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout
from rlcore.rollout.weight_sync import sync_adapters, sync_weights

pytestmark = pytest.mark.numerics  # compares floats across processes and kernels

RESPONSE = 5
CPU = torch.device("cpu")


def nll(outputs, mb):
    mask = mb.batch["response_mask"]
    return -(outputs["log_probs"] * mask).sum() / mask.sum(), {}


def log_probs(engine, data):
    return engine.forward([data], lambda out, mb: {"lp": out["log_probs"]})[0]["lp"]


def lora_engine(model_dir, model_dtype="fp32", **kw):
    torch.manual_seed(0)  # peft draws A at random (B starts at zero): every rank and every run the same
    return FSDP2Engine(EngineSpec(model_path=model_dir, lr=1e-2, weight_decay=0.0, lora=LoraSpec(4, 8), model_dtype=model_dtype, **kw), CPU)


def train_steps(engine, data, steps=2):
    for _ in range(steps):
        engine.forward_backward([data], nll)
        engine.optimizer_step()


@pytest.fixture
def data():
    return DataProto.from_dict(make_rollout_batch(6, 6, RESPONSE, 100, seed=1))


@pytest.fixture
def pg():
    init_gloo(0, 1, free_port())
    yield
    close_gloo()


def test_only_adapters_train_and_the_reference_is_the_base(pg, tiny_model_dir, data):
    engine = lora_engine(tiny_model_dir)
    base = load_causal_lm(tiny_model_dir)
    trainable, total = trainable_share(engine.model)
    # r x (in + out) per linear: 7 linears per block, 2 blocks, hidden 64, intermediate 128, 2 of 4 heads for k/v.
    per_block = 4 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 2 + (128 + 64))
    assert trainable == 2 * per_block and trainable == sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    assert total - trainable == sum(p.numel() for p in base.parameters())
    frozen = {n: p.full_tensor().clone() for n, p in engine.model.named_parameters() if not p.requires_grad}
    lp_start = log_probs(engine, data)
    train_steps(engine, data)
    assert all(torch.equal(frozen[n], p.full_tensor()) for n, p in engine.model.named_parameters() if not p.requires_grad)
    lp_trained = log_probs(engine, data)
    with engine.disabled_adapters():
        lp_ref = log_probs(engine, data)
    b = data.batch
    with torch.no_grad():
        logits = base(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    base_lp = token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"])["log_probs"]
    torch.testing.assert_close(lp_ref, base_lp, atol=1e-5, rtol=0)  # B starts at zero: the start IS the base
    torch.testing.assert_close(lp_start, base_lp, atol=1e-5, rtol=0)
    assert (lp_trained - lp_ref).abs().max() > 0.05  # the adapters moved the policy; disabling them undoes it


def rollout_log_probs(rollout, data):
    b = data.batch
    with torch.no_grad():
        logits = rollout.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    return token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"])["log_probs"]


def test_rollout_gets_merged_weights_then_only_adapted_ones(pg, tiny_model_dir, data):
    # A bf16 base: the merge happens in fp32, so the rollout (fp32 on CPU) computes exactly what training does.
    engine = lora_engine(tiny_model_dir, model_dtype="bf16")
    assert {p.dtype for p in engine.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in engine.model.parameters() if p.requires_grad} == {torch.float32}
    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=CPU)
    train_steps(engine, data, 1)
    assert sync_weights(engine, rollout) == len(dict(load_causal_lm(tiny_model_dir).named_parameters()))
    torch.testing.assert_close(rollout_log_probs(rollout, data), log_probs(engine, data), atol=1e-5, rtol=0)
    train_steps(engine, data, 1)
    assert sync_weights(engine, rollout, adapted_only=True) == 2 * 7  # the 7 adapted linears of each block
    torch.testing.assert_close(rollout_log_probs(rollout, data), log_probs(engine, data), atol=1e-5, rtol=0)


def test_without_merging_the_rollout_gets_the_base_once_then_the_adapters_alone(pg, tiny_model_dir, data):
    """model.lora.merge=False: the first sync streams the frozen base unmerged plus the adapters (A and B of the 7
    linears of each block, under HF module names), later ones the adapters alone; the native rollout applies them
    (its fused q/k/v and gate/up GEMMs too) and computes what training computes."""
    engine = lora_engine(tiny_model_dir, model_dtype="bf16")
    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=CPU)
    train_steps(engine, data, 1)
    stats = {}
    assert sync_adapters(engine, rollout, with_base=True, stats=stats) == len(dict(load_causal_lm(tiny_model_dir).named_parameters())) + 2 * 2 * 7
    torch.testing.assert_close(rollout_log_probs(rollout, data), log_probs(engine, data), atol=1e-5, rtol=0)
    train_steps(engine, data, 1)
    assert sync_adapters(engine, rollout, with_base=False, stats=stats) == 2 * 2 * 7
    per_block = 4 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 2 + (128 + 64))  # r x (in + out) per linear, fp32
    assert stats["bytes"] == stats["adapter_bytes"] == 2 * per_block * 4
    torch.testing.assert_close(rollout_log_probs(rollout, data), log_probs(engine, data), atol=1e-5, rtol=0)
    assert rollout.decoder is not None and rollout.decoder.adapters is rollout.adapters  # the fused path applies them too
    ids, mask = data.batch["input_ids"][:2, :6], data.batch["attention_mask"][:2, :6]
    out = rollout.generate(ids, mask, SamplingParams(max_tokens=4, do_sample=False))
    seq = {k: v for k, v in assemble_sequences(ids, mask, out).items() if k in ("input_ids", "attention_mask", "position_ids")}
    generated = DataProto.from_dict({**seq, "responses": out.responses, "response_mask": out.response_mask})
    torch.testing.assert_close(out.response_log_probs, log_probs(engine, generated) * out.response_mask, atol=1e-5, rtol=0)


def test_checkpoint_is_a_peft_adapter_and_resumes_exactly(pg, tiny_model_dir, data, tmp_path):
    from peft import PeftModel

    engine = lora_engine(tiny_model_dir)
    train_steps(engine, data)
    path = str(tmp_path / "ckpt")
    engine.save(path, hf_dir=str(tmp_path / "hf"))
    # Only adapters and their optimizer state: far smaller than the base.
    assert os.path.getsize(os.path.join(path, "lora_adapter", "adapter_model.safetensors")) < 0.2 * os.path.getsize(str(tmp_path / "hf" / "model.safetensors"))
    expected = log_probs(engine, data)
    b = data.batch
    peft_model = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir), os.path.join(path, "lora_adapter"))
    merged = load_causal_lm(str(tmp_path / "hf"))  # the merged HF export
    for model in (peft_model, merged):
        with torch.no_grad():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
        torch.testing.assert_close(token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"])["log_probs"], expected, atol=1e-5, rtol=0)

    train_steps(engine, data, 1)  # the uninterrupted run's next step
    resumed = lora_engine(tiny_model_dir)
    resumed.load(path)
    train_steps(resumed, data, 1)
    for (n, p), q in zip(engine.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), n


def test_adapter_path_starts_from_a_saved_adapter(pg, tiny_model_dir, data, tmp_path):
    engine = lora_engine(tiny_model_dir)
    train_steps(engine, data)
    engine.save(str(tmp_path / "ckpt"))
    started = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lora=LoraSpec(4, 8, adapter_path=str(tmp_path / "ckpt" / "lora_adapter"))), CPU)
    torch.testing.assert_close(log_probs(started, data), log_probs(engine, data), atol=1e-6, rtol=0)
    assert trainable_share(started.model)[0] == trainable_share(engine.model)[0]  # and it trains on
    with pytest.raises(FileNotFoundError, match="lora_adapter_path.*adapter_config.json"):
        FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lora=LoraSpec(4, 8, adapter_path=str(tmp_path))), CPU)


def test_lora_critic_trains_its_value_head_and_exports_an_hf_value_model(pg, tiny_model_dir, data, tmp_path):
    critic = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, kind="value", lr=1e-2, lora=LoraSpec(4, 8)), CPU)
    trained = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert any("score.modules_to_save" in n for n in trained) and all("lora_" in n or "score" in n for n in trained)

    def value_loss(outputs, mb):
        return ((outputs["values"] - 1.0) ** 2).mean(), {}

    first = critic.forward_backward([data], value_loss)
    critic.optimizer_step()
    values = critic.forward([data], lambda out, mb: {"v": out["values"]})[0]["v"]
    critic.save_hf(str(tmp_path / "hf"))
    exported = load_value_model(str(tmp_path / "hf"))
    b = data.batch
    with torch.no_grad():
        out = exported(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    torch.testing.assert_close(out[:, -RESPONSE - 1 : -1, 0], values, atol=1e-5, rtol=0)
    assert first == [{}]


def _two_rank_main(rank, world_size, port, model_dir, out_path):
    init_gloo(rank, world_size, port)
    data = DataProto.from_dict(make_rollout_batch(6, 6, RESPONSE, 100, seed=1))
    engine = lora_engine(model_dir, model_dtype="bf16")
    engine.forward_backward([data.chunk(world_size)[rank]], lambda o, mb: (nll(o, mb)[0] / world_size, {}))
    engine.optimizer_step()
    # Small buckets of reused shared memory: a module's base and factors span buckets and must be held as copies.
    weights = {k: v.clone() for k, v in engine.rollout_weights(bucket_bytes=1 << 14, transient=True)}
    if rank == 0:
        torch.save(weights, out_path)
    close_gloo()


def test_two_sharded_ranks_stream_the_same_merged_weights(tiny_model_dir, data, tmp_path):
    out = str(tmp_path / "w.pt")
    spawn_ranks(_two_rank_main, 2, lambda port: (2, port, tiny_model_dir, out))
    sharded = torch.load(out, weights_only=True)
    init_gloo(0, 1, free_port())
    try:
        engine = lora_engine(tiny_model_dir, model_dtype="bf16")
        engine.forward_backward([data.chunk(2)[0]], lambda o, mb: (nll(o, mb)[0] / 2, {}))
        engine.forward_backward([data.chunk(2)[1]], lambda o, mb: (nll(o, mb)[0] / 2, {}))
        engine.optimizer_step()
        single = dict(engine.rollout_weights())
    finally:
        close_gloo()
    assert sharded.keys() == single.keys()
    # Adam's first step moves each B entry by lr * g / (|g| + eps): ~lr whatever the last bits of g, except where g
    # is within a few eps of zero and the two reduction orders may disagree by up to 2 lr. Such an entry moves one
    # row of B @ A by at most 2 lr * scaling * rank * max|A| (peft draws A within 1/sqrt(fan_in) <= 1/8 here).
    bound = 2 * 1e-2 * (8 / 4) * 4 / 8
    for name in single:
        diff = (sharded[name] - single[name]).abs()
        assert diff.max() <= bound and (diff <= 1e-5).float().mean() >= 0.95, (name, diff.max())


def test_lora_loads_on_meta_with_adapters_drawn_as_peft_draws_them(pg, tiny_model_dir):
    """No whole model on any rank: the peft model is built on meta, its base read by HF name, its adapters drawn
    whole (A kaiming-uniform within 1/sqrt(fan_in), B zero: the adapted model starts as the base)."""
    import rlcore.engine.fsdp2 as fsdp2

    loads = []
    whole = fsdp2.load_causal_lm
    fsdp2.load_causal_lm = lambda *a, **k: loads.append(k.get("weights", True)) or whole(*a, **k)
    try:
        engine = lora_engine(tiny_model_dir)
    finally:
        fsdp2.load_causal_lm = whole
    assert loads == [False]
    factors = {name: p.full_tensor() for name, p in engine.model.named_parameters() if ".lora_" in name}
    a = [t for name, t in factors.items() if ".lora_A." in name]
    assert a and all(t.abs().max() <= 1 / t.shape[1] ** 0.5 and t.std() > 0.3 / t.shape[1] ** 0.5 for t in a)
    assert all(not t.any() for name, t in factors.items() if ".lora_B." in name)
    base = load_causal_lm(tiny_model_dir).state_dict()
    assert all(torch.equal(t, base[name]) for name, t in engine.rollout_weights())  # merged with B = 0: the checkpoint
