"""LoRA on megatron-core (rlcore/engine/megatron/lora.py, verl's model.lora.*): the adapted model starts as the
base, one step trains the adapters only, every layout (TP2 with sequence parallelism, PP2) takes the step data
parallelism takes, the exported weights are the merged ones (the rollout's log-probs after a sync equal the engine's),
and with the adapters off the model is the base again (the reference policy)."""

import os

import pytest
import torch
import torch.distributed as dist
from dist_utils import close_gloo, init_gloo, spawn_ranks

from rlcore.models.lora import LoraSpec

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.numerics

# name: (tp, pp, sequence_parallel), all on 2 ranks (one spawn): DP2 is the reference (data parallelism is exact);
# TP2 with sequence parallelism covers both adapters' TP collectives and the sequence-parallel gather / reduce-scatter
LAYOUTS = {"dp2": (1, 1, False), "tp2_sp": (2, 1, True), "pp2": (1, 2, False)}
LORA = LoraSpec(rank=4, alpha=8, target_modules=("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"), init_a="kaiming")


def _one_layout(layout, model_dir, out_dir):
    import test_megatron
    from megatron.core import parallel_state as mpu
    from test_megatron import batch, megatron_spec, policy_loss_fn

    from rlcore.data.micro_batches import MicroBatchSpec
    from rlcore.engine.base import TokenRequest
    from rlcore.engine.factory import build_engine
    from rlcore.rollout.native import NativeRollout
    from rlcore.rollout.weight_sync import sync_adapters, sync_weights
    from rlcore.workers.common import run_forward

    tp, pp, sp = LAYOUTS[layout]
    test_megatron.LAYOUTS[layout] = (tp, pp, None, sp, False, False)
    cpu = torch.device("cpu")
    # SGD: the step is linear in the gradient, so layouts whose gradients agree to float noise land on the same weights
    # (Adam's first step is lr * sign(g): a near-zero gradient entry's sign, and so its step, is noise)
    spec = megatron_spec(model_dir, layout, lora=LORA)
    spec.lr, spec.optimizer_overrides = 1.0, {"optimizer": "sgd"}
    spec.megatron.use_distributed_optimizer = False  # megatron-core's distributed optimizer is Adam only
    engine = build_engine("megatron", spec, cpu)
    data = batch(engine.vocab_size)
    def lp():  # None on a rank that holds no output (TP rank > 0, an earlier pipeline stage)
        out = run_forward(engine, data, MicroBatchSpec(rows=4), lambda o, mb: {"lp": o["log_probs"]})
        return out.batch["lp"] if engine.is_output_rank else None

    before = lp()
    base_weights = {k: v.clone() for k, v in engine.rollout_weights()}
    shard = data.chunk(engine.dp_size)[engine.dp_rank]  # each replica trains on its half of the batch
    engine.forward_backward(shard.split(2), policy_loss_fn(data, engine.dp_size), TokenRequest(entropy=True))
    step = engine.optimizer_step()
    after = lp()
    with engine.disabled_adapters():
        base_after = lp()
    merged = {k: v.clone() for k, v in engine.rollout_weights()}
    b = data.batch

    def rollout_log_probs(sync):
        rollout = NativeRollout(model_dir, pad_token_id=0, device=cpu)
        sync(rollout)
        with torch.no_grad():
            logits = rollout.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
        return torch.log_softmax(logits[:, -b["responses"].shape[1] - 1 : -1].float(), -1).gather(-1, b["responses"][..., None])[..., 0]

    rollout_lp = rollout_log_probs(lambda r: sync_weights(engine, r))
    # model.lora.merge=False: the base unmerged, then the adapters gathered into peft's names, applied by the rollout
    unmerged_lp = rollout_log_probs(lambda r: sync_adapters(engine, r, with_base=True))
    unmerged = {k: v.clone() for k, v in engine.rollout_weights(unmerged=True)}
    adapters = engine.rollout_adapters()
    trainable = sorted(n for chunk in engine.modules for n, p in chunk.named_parameters() if p.requires_grad)
    if engine.is_output_rank and engine.dp_rank == 0:
        torch.save({"before": before, "after": after, "base_after": base_after, "base": base_weights, "merged": merged,
                    "grad_norm": step["grad_norm"], "rollout_lp": rollout_lp, "trainable": trainable, "unmerged_lp": unmerged_lp,
                    "unmerged": unmerged, "adapters": adapters,
                    "mask": b["response_mask"].bool()}, os.path.join(out_dir, f"{layout}.pt"))
    dist.barrier()
    mpu.destroy_model_parallel()


def _rank_main(rank, world, port, layouts, model_dir, out_dir):
    init_gloo(rank, world, port)
    for layout in layouts:
        _one_layout(layout, model_dir, out_dir)
    close_gloo()


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron_lora")
    spawn_ranks(_rank_main, 2, lambda port: (2, port, list(LAYOUTS), tiny_model_dir, str(out)))
    return {layout: torch.load(out / f"{layout}.pt", weights_only=False) for layout in LAYOUTS}


def test_the_adapted_model_starts_as_the_base_and_trains_the_adapters_only(results):
    one = results["dp2"]
    mask = one["mask"]
    torch.testing.assert_close(one["before"][mask], one["base_after"][mask], atol=1e-6, rtol=0)  # B = 0, and adapters off = base
    assert (one["after"] - one["before"])[mask].abs().max() > 1e-4  # the step changed the adapted model
    assert one["trainable"] and all(".adapter.lora_" in n for n in one["trainable"])
    changed = [k for k in one["base"] if not torch.equal(one["base"][k], one["merged"][k])]
    assert changed and all(any(p in k for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")) for k in changed)


@pytest.mark.parametrize("layout", ["tp2_sp", "pp2"])
def test_every_layout_takes_the_data_parallel_step(results, layout):
    one, other = results["dp2"], results[layout]
    assert other["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    torch.testing.assert_close(other["after"][one["mask"]], one["after"][one["mask"]], atol=1e-5, rtol=1e-5)
    for name, weight in one["merged"].items():
        torch.testing.assert_close(other["merged"][name], weight, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_rollout_gets_the_merged_weights(results, layout):
    r = results[layout]
    mask = r["mask"]
    torch.testing.assert_close(r["rollout_lp"][mask], r["after"][mask], atol=1e-5, rtol=1e-5)


def test_target_and_exclude_modules_pick_the_adapted_linears():
    """model.lora.target_modules: megatron-core names or fnmatch patterns over full names (verl's wildcard form);
    model.lora.exclude_modules: every dense linear but those (with target_modules empty, as verl requires)."""
    from rlcore.engine.megatron.lora import targets

    qkv0, fc2_1 = "decoder.layers.0.self_attention.linear_qkv", "decoder.layers.1.mlp.linear_fc2"
    assert targets(qkv0, LORA) and targets(fc2_1, LORA) and not targets("output_layer", LORA)
    only_first = LoraSpec(4, 8, ("*.layers.0.*.linear_qkv",))
    assert targets(qkv0, only_first) and not targets("decoder.layers.1.self_attention.linear_qkv", only_first)
    all_but_fc2 = LoraSpec(4, 8, (), exclude_modules=("linear_fc2",))
    assert targets(qkv0, all_but_fc2) and not targets(fc2_1, all_but_fc2)


@pytest.mark.parametrize("method", ["xavier", "kaiming"])
def test_lora_A_init_method_draws_A_and_B_starts_at_zero(monkeypatch, method):
    """model.lora.lora_A_init_method: xavier normal (std sqrt(2 / (rank + in))) or kaiming uniform (bound
    1 / sqrt(in), peft's); B is zero, so the adapted model starts as the base."""
    from types import SimpleNamespace

    from rlcore.engine.megatron import lora

    monkeypatch.setattr(lora, "mpu", SimpleNamespace(get_tensor_model_parallel_world_size=lambda: 1, get_tensor_model_parallel_rank=lambda: 0))
    adapter = lora.Adapter(torch.nn.Linear(256, 32), rank=16, alpha=32, a_init=method, seed=3)
    a = adapter.lora_A
    assert a.shape == (16, 256) and not adapter.lora_B.any()
    if method == "xavier":
        assert a.std().item() == pytest.approx((2 / (16 + 256)) ** 0.5, rel=0.05)
    else:
        assert a.abs().max().item() <= 1 / 16 and a.std().item() == pytest.approx(1 / 16 / 3**0.5, rel=0.05)


def test_each_backends_lora_keys_are_refused_with_the_other_naming_its_own():
    from rlcore.config import compose
    from rlcore.config.validate import ConfigError, validate_config

    ARR = "actor_rollout_ref"
    megatron = [f"{ARR}.actor.strategy=megatron", f"{ARR}.actor.megatron.tensor_model_parallel_size=1"]
    with pytest.raises(ConfigError) as refused:
        validate_config(compose(["recipe=tiny_cpu", f"{ARR}.model.lora.rank=8"]))
    assert any(f"{ARR}.model.lora.rank=8 is verl's Megatron LoRA section; with {ARR}.actor.strategy=fsdp use {ARR}.model.lora_rank=8"
               in m for m in refused.value.messages)
    with pytest.raises(ConfigError) as refused:
        validate_config(compose(["recipe=tiny_cpu", *megatron, f"{ARR}.model.lora.rank=8", f"{ARR}.model.lora.exclude_modules=[linear_fc2]",
                                 f"{ARR}.model.lora.lora_A_init_method=orthogonal"]))
    messages = "\n".join(refused.value.messages)
    assert f"{ARR}.model.lora.exclude_modules adapts every dense linear except those, so {ARR}.model.lora.target_modules must be empty" in messages
    assert f"{ARR}.model.lora.lora_A_init_method=orthogonal" in messages


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_without_merging_the_rollout_gets_the_base_and_the_adapters_in_peft_names(results, layout):
    """model.lora.merge=False: the base streams unmerged (equal to the weights before any step), the adapters come
    gathered from their TP / PP layout, one A per q/k/v and gate/up part; base + s B A is the merged weight, and the
    rollout applying them gives the engine's log-probs."""
    r = results[layout]
    adapters = r["adapters"]
    for name, weight in r["unmerged"].items():
        torch.testing.assert_close(weight, r["base"][name], atol=0, rtol=0, msg=name)
    assert len(adapters.modules) == 7 * 2  # q, k, v, o, gate, up, down in each of the tiny model's layers
    for module in adapters.modules:
        a, b = adapters.pair(module)
        merged = r["unmerged"][f"{module}.weight"] + adapters.scaling * b @ a
        torch.testing.assert_close(merged, r["merged"][f"{module}.weight"], atol=1e-6, rtol=1e-5, msg=module)
    torch.testing.assert_close(r["unmerged_lp"][r["mask"]], r["after"][r["mask"]], atol=1e-5, rtol=1e-5)
