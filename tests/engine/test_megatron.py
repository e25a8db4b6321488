"""The Megatron engine on gloo ranks against a single-process HF reference, per layout (TP=2; PP=2; TP=2 x PP=2 on
4 ranks; interleaved PP=2 x VPP=2; DP=2 with the distributed optimizer): log-probs, entropy, the policy loss, its
gradients, one AdamW step, critic values, the hybrid-engine weight stream, and HF <-> Megatron weights both ways
(Qwen2 untied with QKV bias; Llama tied with an odd vocabulary that TP must pad).

Tolerances, all float32: log-probs/entropy/values 1e-5 (megatron splits matmuls and softmax statistics over TP
ranks: other summation orders, ~1e-7 relative); loss 1e-6; gradients atol 1e-6 + rtol 1e-4 (as the FSDP2 parity
test); weights after one AdamW step within the bound their two gradients imply (tests/engine/test_fsdp2.py);
exported weights bit-identical (a pure re-layout, no arithmetic).
"""

import os

import pytest
import torch
import torch.distributed as dist
from dist_utils import close_gloo, init_gloo, make_rollout_batch, spawn_ranks, token_outputs
from omegaconf import OmegaConf
from test_fsdp2 import adam_first_step_bound

from rlcore.config.actor_schema import ActorConfig
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.models.hf import load_causal_lm, load_config, load_value_model
from rlcore.protocol import DataProto
from rlcore.workers.actor import make_policy_loss_fn

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.numerics

# the schema's actor section (every field the loss reads has its default), with these settings
ACTOR = OmegaConf.merge(OmegaConf.structured(ActorConfig), {
    "policy_loss": {"loss_mode": "vanilla"}, "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0, "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.1,
})
ROWS, PROMPT, RESPONSE, LR = 8, 6, 5, 1e-2
# name: (tp, pp, vpp, sequence_parallel, packed sequences, micro-batches by token budget instead of 3 rows)
LAYOUTS = {
    "tp2": (2, 1, None, False, False, False),
    "tp2_sp_packed_budget": (2, 1, None, True, True, True),
    "pp2_packed_budget": (1, 2, None, False, True, True),
    "tp2_pp2_sp": (2, 2, None, True, False, False),
    "pp2_vpp2": (1, 2, 2, False, False, False),
    "dp2_packed": (1, 1, None, False, True, False),
}


def megatron_spec(model_dir, layout, kind="causal_lm", trainable=True, **kw):
    from rlcore.engine.base import EngineSpec

    tp, pp, vpp, sp, packed, _ = LAYOUTS[layout]
    megatron = dict(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                    sequence_parallel=sp, use_distributed_optimizer=True, seed=1)
    return EngineSpec(model_path=model_dir, kind=kind, trainable=trainable, megatron=MegatronConfig(**megatron), param_dtype="float32", lr=LR,
                      weight_decay=0.0, grad_clip=1e9, use_remove_padding=packed, **kw)


def micro_spec(layout: str):
    """3-row micro-batches, or uneven ones by a 40-token budget (what use_dynamic_bsz makes)."""
    from rlcore.data.micro_batches import MicroBatchSpec

    packed, budget = LAYOUTS[layout][4:]
    return MicroBatchSpec(max_tokens=40, packed=packed) if budget else MicroBatchSpec(rows=3, packed=packed)


def batch(vocab: int) -> DataProto:
    return DataProto.from_dict(make_rollout_batch(ROWS, PROMPT, RESPONSE, vocab))


def policy_loss_fn(data: DataProto, dp_size: int):
    return make_policy_loss_fn(ACTOR, (float(data.batch["response_mask"].sum()), float(ROWS)), dp_size)


def hf_grads(engine) -> dict[str, torch.Tensor]:
    """The accumulated gradients under HF names (DP=1: megatron's grad buffers hold whole gradients): exported
    through the engine's own weight stream by swapping each parameter's data with its gradient for a moment."""
    params = [p for chunk in engine.modules for p in chunk.parameters()]
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(p.main_grad)
        grads = {k: v.clone() for k, v in engine.rollout_weights()}
        for p, s in zip(params, saved):
            p.copy_(s)
    return grads


def _one_layout(rank, layout, qwen_dir, llama_dir, rm_dir, out_dir):
    from rlcore.data.micro_batches import make_micro_batches
    from rlcore.engine.base import TokenRequest
    from rlcore.engine.factory import build_engine
    from rlcore.rollout.native import NativeRollout
    from rlcore.rollout.weight_sync import sync_weights
    from rlcore.workers.common import run_forward

    cpu = torch.device("cpu")
    out = {}
    engine = build_engine("megatron", megatron_spec(qwen_dir, layout), cpu)
    out["loaded_weights"] = dict(engine.rollout_weights())  # before any training: the HF checkpoint, re-laid out
    data = batch(engine.vocab_size)
    shard = data.chunk(engine.dp_size)[engine.dp_rank]
    request = TokenRequest(temperature=0.7, entropy=True, sum_pi_squared=True)
    fwd = run_forward(engine, shard, micro_spec(layout), lambda o, mb: {"lp": o["log_probs"], "ent": o["entropy"], "spp": o["sum_pi_squared"]},
                      request)
    parts, _ = make_micro_batches(shard, micro_spec(layout))
    assert len(parts) > 1  # token budgets: several micro-batches, each trimmed to its own width (PP: shapes differ)
    metrics = engine.forward_backward(parts, policy_loss_fn(data, engine.dp_size), TokenRequest(entropy=True))
    if engine.dp_size == 1:
        out["grads"] = hf_grads(engine)
    step = engine.optimizer_step()
    out["weights"] = dict(engine.rollout_weights())
    # Hybrid engine: the updated weights streamed into a rollout replica give the trained model's log-probs.
    rollout = NativeRollout(qwen_dir, pad_token_id=0, device=cpu)
    sync_weights(engine, rollout)
    after = engine.forward([shard], lambda o, mb: {"lp": o["log_probs"]})
    b = shard.batch
    with torch.no_grad():
        logits = rollout.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    rollout_lp = token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"])["log_probs"]
    critic = build_engine("megatron", megatron_spec(rm_dir, layout, kind="value", trainable=False), cpu)
    values = critic.forward(shard.split(5), lambda o, mb: {"v": o["values"]})
    llama = build_engine("megatron", megatron_spec(llama_dir, layout, trainable=False), cpu)
    out["llama_weights"] = dict(llama.rollout_weights())
    llama_lp = llama.forward([shard], lambda o, mb: {"lp": o["log_probs"]})
    if engine.is_output_rank:
        out.update(
            dp_rank=engine.dp_rank, lp=fwd.batch["lp"], ent=fwd.batch["ent"], spp=fwd.batch["spp"],
            pg_loss=sum(m["actor/pg_loss"] for m in metrics), grad_norm=step["grad_norm"], after_lp=torch.cat([r["lp"] for r in after]),
            rollout_lp=rollout_lp, values=torch.cat([r["v"] for r in values]), llama_lp=torch.cat([r["lp"] for r in llama_lp]),
        )
    torch.save(out, os.path.join(out_dir, layout, f"rank{rank}.pt"))


def _rank_main(rank, world, port, layouts, qwen_dir, llama_dir, rm_dir, out_dir):
    """Every layout of one world size in the same processes, one after the other: each builds megatron-core's groups
    for itself and tears them down after (a spawn per layout paid the ranks' imports six times)."""
    from megatron.core import parallel_state as mpu

    init_gloo(rank, world, port)
    for layout in layouts:
        _one_layout(rank, layout, qwen_dir, llama_dir, rm_dir, out_dir)
        dist.barrier()
        mpu.destroy_model_parallel()
    close_gloo()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from conftest import build_tiny_llama_dir, build_tiny_model_dir
    from transformers import Qwen2ForSequenceClassification

    root = tmp_path_factory.mktemp("megatron_models")
    qwen = build_tiny_model_dir(str(root / "qwen2"), layers=4)
    llama = build_tiny_llama_dir(str(root / "llama"))
    config = load_config(qwen)
    config.num_labels = 1
    torch.manual_seed(5)
    rm = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.save_pretrained(str(root / "rm"))
    return qwen, llama, str(root / "rm")


@pytest.fixture(scope="module")
def reference(model_dirs):
    """Single process, plain HF modules, plain AdamW: what every layout must reproduce."""
    qwen, llama, rm_dir = model_dirs
    model = load_causal_lm(qwen)
    data = batch(model.config.vocab_size)
    b = data.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    warm = token_outputs(logits[:, -RESPONSE - 1 : -1] / 0.7, b["responses"])
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    loss, metrics = policy_loss_fn(data, 1)(token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"]), data)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
    torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0).step()
    critic = load_value_model(rm_dir)
    with torch.no_grad():
        values = critic(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
        llama_model = load_causal_lm(llama)
        llama_logits = llama_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    return {
        "data": data, "lp": warm["log_probs"], "ent": warm["entropy"], "spp": warm["sum_pi_squared"],
        "pg_loss": float(metrics["actor/pg_loss"]), "grads": grads,
        "grad_norm": grad_norm, "weights": dict(model.state_dict()), "values": values[:, -RESPONSE - 1 : -1, 0],
        "llama_weights": {k: v for k, v in llama_model.state_dict().items() if k != "lm_head.weight"},  # tied: HF saves one
        "llama_lp": token_outputs(llama_logits[:, -RESPONSE - 1 : -1], b["responses"])["log_probs"],
    }


def world_size(layout: str) -> int:
    tp, pp = LAYOUTS[layout][:2]
    return tp * pp * (2 if layout.startswith("dp2") else 1)


@pytest.fixture(scope="module")
def layout_dir(model_dirs, tmp_path_factory):
    """Every layout run, one spawn per world size; each layout's rank outputs in <dir>/<layout>/rank<r>.pt."""
    out_dir = tmp_path_factory.mktemp("megatron_layouts")
    for world in sorted({world_size(layout) for layout in LAYOUTS}):
        layouts = [layout for layout in LAYOUTS if world_size(layout) == world]
        for layout in layouts:
            (out_dir / layout).mkdir()
        spawn_ranks(_rank_main, world, lambda port: (world, port, layouts, *model_dirs, str(out_dir)))
    return out_dir


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_result(request, layout_dir):
    ranks = [torch.load(layout_dir / request.param / f"rank{r}.pt", weights_only=False) for r in range(world_size(request.param))]
    outputs = sorted((r for r in ranks if "lp" in r), key=lambda r: r["dp_rank"])  # one output rank per replica
    return request.param, ranks, outputs


def joined(outputs, key):
    return torch.cat([o[key] for o in outputs])


def test_log_probs_entropy_and_values_equal_hf(layout_result, reference):
    _, _, outputs = layout_result
    mask = reference["data"].batch["response_mask"].bool()
    for key in ("lp", "ent", "spp", "values"):  # spp: sum_v p(v)^2 (TokenRequest.sum_pi_squared), over TP's vocabulary shards too
        torch.testing.assert_close(joined(outputs, key)[mask], reference[key][mask], atol=1e-5, rtol=1e-5, msg=key)


def test_loss_gradients_and_one_adamw_step_equal_hf(layout_result, reference):
    name, ranks, outputs = layout_result
    assert sum(o["pg_loss"] for o in outputs) / len(outputs) == pytest.approx(reference["pg_loss"], abs=1e-6)
    assert outputs[0]["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    grads = ranks[0].get("grads")  # absent with DP=2: the buffers then hold reduce-scattered shards
    for key, want in (reference["grads"].items() if grads else ()):
        torch.testing.assert_close(grads[key], want, atol=1e-6, rtol=1e-4, msg=key)
    for rank in ranks:  # every rank streams the same full weights
        for key, want in reference["weights"].items():
            g_ref = reference["grads"][key]
            if grads:
                bound = adam_first_step_bound(grads[key], g_ref, LR)
            else:  # gradients agree to 1e-6 + 1e-4|g| (the check above): only |g| ~ eps may move by up to 2 lr
                bound = torch.where(g_ref.abs() > 1e-5, torch.full_like(g_ref, 1e-5), torch.full_like(g_ref, 2 * LR))
            assert ((rank["weights"][key] - want).abs() <= bound).all(), key


def test_weight_sync_makes_the_rollout_model_equal_the_trained_model(layout_result, reference):
    mask = reference["data"].batch["response_mask"].bool()
    mask = mask.chunk(len(layout_result[2]))  # each output rank holds its replica's share of the rows
    for o, m in zip(layout_result[2], mask):
        torch.testing.assert_close(o["rollout_lp"][m], o["after_lp"][m], atol=1e-5, rtol=1e-5)


def test_hf_to_megatron_to_hf_is_bit_identical_for_qwen2_and_tied_llama(layout_result, reference, model_dirs):
    _, ranks, outputs = layout_result
    qwen = dict(load_causal_lm(model_dirs[0]).state_dict())
    for rank in ranks:
        assert rank["loaded_weights"].keys() == qwen.keys()
        assert all(torch.equal(rank["loaded_weights"][k], v) for k, v in qwen.items())
        assert rank["llama_weights"].keys() == reference["llama_weights"].keys()
        assert all(torch.equal(rank["llama_weights"][k], v) for k, v in reference["llama_weights"].items())
    mask = reference["data"].batch["response_mask"].bool()
    torch.testing.assert_close(joined(outputs, "llama_lp")[mask], reference["llama_lp"][mask], atol=1e-5, rtol=1e-5)
