"""Megatron engine features on 2 gloo ranks: recompute, non-finite steps, exact checkpoint resume with the
distributed optimizer sharded over 2 data-parallel ranks, offload round trips, and the HF export."""

import json
import os

import pytest
import torch
from dist_utils import close_gloo, init_gloo, make_rollout_batch, spawn_ranks

from rlcore.config.megatron_schema import MegatronConfig
from rlcore.protocol import DataProto

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.numerics


def nll(outputs, mb):
    mask = mb.batch["response_mask"]
    return -(outputs["log_probs"] * mask).sum() / mask.sum(), {"nll": 0.0}


def spec(model_dir, tp, transformer=None, **kw):
    from rlcore.engine.base import EngineSpec

    megatron = MegatronConfig(tensor_model_parallel_size=tp, sequence_parallel=False, use_distributed_optimizer=True, seed=1,
                              override_transformer_config=transformer or {})
    return EngineSpec(model_path=model_dir, megatron=megatron, **{"param_dtype": "float32", "lr": 1e-2, "weight_decay": 0.1, **kw})


def train(engine, data, steps):
    shard = data.chunk(engine.dp_size)[engine.dp_rank]
    for _ in range(steps):
        engine.forward_backward(shard.split(2), nll)
        engine.optimizer_step()


def weights(engine):
    return {k: v.clone() for k, v in engine.rollout_weights()}


def _tp2_main(rank, port, model_dir, out):
    from test_megatron import hf_grads

    from rlcore.engine.factory import build_engine

    init_gloo(rank, 2, port)
    cpu = torch.device("cpu")
    data = DataProto.from_dict(make_rollout_batch(6, 6, 5, 100, seed=1))

    def tp_attributes(engine):
        return {f"{c}.{n}": (getattr(p, "tensor_model_parallel", False), getattr(p, "partition_dim", -1), getattr(p, "partition_stride", 1))
                for c, chunk in enumerate(engine.model) for n, p in chunk.named_parameters()}

    # rlcore builds without megatron-core's init (the checkpoint fills every weight) and sets the TP attributes itself
    attributes = [tp_attributes(build_engine("megatron", spec(model_dir, 2, transformer=t), cpu))
                  for t in (None, {"perform_initialization": True})]
    grads = []
    for checkpointing in (False, True):
        engine = build_engine("megatron", spec(model_dir, 2, gradient_checkpointing=checkpointing), cpu)
        engine.forward_backward(data.split(3), nll)
        grads.append(hf_grads(engine))
    before = weights(engine)
    engine.optimizer.zero_grad()
    for chunk in engine.model:
        chunk.zero_grad_buffer()
    engine.forward_backward([data], lambda o, mb: (nll(o, mb)[0] * float("nan"), {}))
    skipped = engine.optimizer_step()
    unchanged = all(torch.equal(before[k], v) for k, v in weights(engine).items())
    engine.forward_backward([data], nll)
    after = engine.optimizer_step()
    moved = any(not torch.equal(before[k], v) for k, v in weights(engine).items())  # collective: every rank
    if rank == 0:
        torch.save({"attributes": attributes, "recompute": engine.config.recompute_granularity, "grads": grads, "skipped": skipped, "unchanged": unchanged,
                    "after": after, "moved": moved}, out)
    close_gloo()


def _dp2_main(rank, port, model_dir, ckpt, out):
    from rlcore.engine.factory import build_engine

    init_gloo(rank, 2, port)
    cpu = torch.device("cpu")
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, 100, seed=2))
    straight = build_engine("megatron", spec(model_dir, 1), cpu)
    train(straight, data, 2)
    first = build_engine("megatron", spec(model_dir, 1), cpu)
    train(first, data, 1)
    first.save(ckpt, hf_dir=os.path.join(ckpt, "huggingface"))
    exported = weights(first)
    resumed = build_engine("megatron", spec(model_dir, 1), cpu)
    resumed.load(ckpt)
    train(resumed, data, 1)
    # load_contents=[model]: the checkpoint's weights under a fresh optimizer (its fp32 main weights re-read from
    # them) and schedule; the same as starting a run from the HF export of those weights.
    # (bf16 params: the main weights are an fp32 copy, not a view of them, so they must be re-read)
    model_only = build_engine("megatron", spec(model_dir, 1, param_dtype="bfloat16"), cpu)
    model_only.load(ckpt, contents=frozenset({"model"}))
    train(model_only, data, 1)
    from_export = build_engine("megatron", spec(os.path.join(ckpt, "huggingface"), 1, param_dtype="bfloat16"), cpu)
    train(from_export, data, 1)
    offloaded = build_engine("megatron", spec(model_dir, 1, param_offload=True, grad_offload=True, optimizer_offload=True), cpu)
    emptied = []
    for _ in range(2):
        train(offloaded, data, 1)
        offloaded.offload()
        emptied.append(sum(b.grad_data.untyped_storage().nbytes() for c in offloaded.model for b in c.buffers))
        offloaded.onload()
    # optim.override_optimizer_config: decoupled_weight_decay=False turns megatron-core's AdamW into Adam with L2
    coupled = build_engine("megatron", spec(model_dir, 1, optimizer_overrides={"decoupled_weight_decay": False}), cpu)
    train(coupled, data, 1)
    result = {"coupled": (type(coupled.optimizer.optimizer).__name__, type(first.optimizer.optimizer).__name__, weights(coupled)),
              "straight": weights(straight), "resumed": weights(resumed), "model_only": weights(model_only),
              "from_export": weights(from_export), "offloaded": weights(offloaded), "exported": exported,
              "emptied": emptied, "shard": sum(p.numel() for p in straight.optimizer.optimizer.param_groups[0]["params"])}
    if rank == 0:
        torch.save(result, out)
    close_gloo()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from conftest import build_tiny_model_dir

    return build_tiny_model_dir(str(tmp_path_factory.mktemp("megatron_features") / "qwen2"))


@pytest.fixture(scope="module")
def tp2(model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tp2") / "out.pt")
    spawn_ranks(_tp2_main, 2, lambda port: (port, model_dir, out))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def dp2(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dp2")
    spawn_ranks(_dp2_main, 2, lambda port: (port, model_dir, str(root / "ckpt"), str(root / "out.pt")))
    return torch.load(root / "out.pt", weights_only=False), str(root / "ckpt")


def test_gradient_checkpointing_recomputes_every_layer_with_identical_gradients(tp2):
    assert tp2["recompute"] == "full"  # model.enable_gradient_checkpointing without explicit recompute_* keys
    plain, recomputed = tp2["grads"]
    for key, grad in plain.items():
        torch.testing.assert_close(recomputed[key], grad, atol=1e-7, rtol=1e-6, msg=key)


def test_weights_left_to_the_checkpoint_are_marked_tensor_parallel_as_megatron_core_marks_them(tp2):
    ours, theirs = tp2["attributes"]
    assert ours == theirs and sum(split for split, _, _ in ours.values()) >= 5  # qkv, proj, fc1, fc2, embedding


def test_non_finite_gradients_skip_the_step_on_every_rank(tp2):
    assert tp2["skipped"]["skipped_step"] == 1.0 and tp2["unchanged"]
    assert tp2["after"]["skipped_step"] == 0.0 and tp2["moved"]


def test_resume_from_a_checkpoint_continues_bit_exactly(dp2):
    out, _ = dp2
    assert out["shard"] < sum(v.numel() for v in out["straight"].values())  # each DP rank's optimizer holds a shard
    for key, value in out["straight"].items():
        assert torch.equal(out["resumed"][key], value), key


def test_loading_the_model_only_starts_a_fresh_optimizer_from_the_loaded_weights(dp2):
    out, _ = dp2
    for key, value in out["from_export"].items():
        assert torch.equal(out["model_only"][key], value), key
    assert any(not torch.equal(out["model_only"][k], v) for k, v in out["resumed"].items())  # not the resumed optimizer's step


def test_offload_round_trips_free_the_buffers_and_keep_training_identical(dp2):
    out, _ = dp2
    assert out["emptied"] == [0, 0]
    for key, value in out["straight"].items():
        assert torch.equal(out["offloaded"][key], value), key


def test_hf_export_loads_in_transformers_and_a_changed_layout_is_refused(dp2, model_dir):
    from transformers import AutoModelForCausalLM

    from rlcore.engine.megatron.engine import MegatronEngine

    out, ckpt = dp2
    model = AutoModelForCausalLM.from_pretrained(os.path.join(ckpt, "huggingface"), local_files_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, out["exported"][key]), key
    with open(os.path.join(ckpt, "megatron_layout.json")) as f:
        assert json.load(f) == {"tp": 1, "pp": 1, "vpp": None, "dp": 2}
    engine = MegatronEngine.__new__(MegatronEngine)  # only the layout check runs: no process group needed
    engine._layout_meta = lambda: {"tp": 2, "pp": 1, "vpp": None, "dp": 1}
    with pytest.raises(ValueError, match="written with megatron layout .* resume with the same"):
        engine.load(ckpt)


def test_override_optimizer_config_reaches_megatron_cores_optimizer(dp2):
    """optim.override_optimizer_config: megatron-core OptimizerConfig fields on top of rlcore's optim keys."""
    from rlcore.engine.megatron.engine import optimizer_config

    result, _ = dp2
    coupled, adamw, coupled_weights = result["coupled"]
    assert (coupled, adamw) == ("Adam", "AdamW")
    # one step from the same start as `exported` (one AdamW step): the coupled decay moves the weights differently
    assert any(not torch.equal(coupled_weights[k], v) for k, v in result["exported"].items())
    with pytest.raises(ValueError, match="optimizer_cpu_ofload not field"):
        optimizer_config({"lr": 1.0}, {"optimizer_cpu_ofload": True})



def test_a_checkpoint_in_the_old_per_rank_files_is_refused_with_the_reason(tmp_path):
    # Before both engines wrote one layout (a torch distributed checkpoint), Megatron's were per-rank torch.save files.
    from rlcore.engine.megatron.engine import MegatronEngine

    (tmp_path / "model_tp0_pp0.pt").write_bytes(b"")
    engine = MegatronEngine.__new__(MegatronEngine)  # only the check runs: no process group needed
    with pytest.raises(ValueError, match=r"per-rank model_tp.* files.*resume it with that rlcore, or start a new run from its HF export"):
        engine.load(str(tmp_path))
