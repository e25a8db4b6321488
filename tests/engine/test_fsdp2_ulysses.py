"""Ulysses sequence parallelism in the FSDP2 engine is exact: on 2 gloo ranks, sp=2 (both ranks share every sample,
each holding half of its packed tokens) against sp=1 (each rank its own half of the samples), the same samples:
log-probs, entropy and values within 1e-5, the loss equal, gradients and the clipped norm within 1e-5. Qwen2
(untied and tied, 2 KV heads), Llama (tied, 8 heads over 2 KV heads) and Qwen3 (q/k norms, 1 KV head: repeated for sp=2),
with gradient checkpointing and with LoRA; the micro-batches' packed lengths are odd (padded to a multiple of sp),
and the loss mask has holes inside responses (multi-turn: tool output is attended to, not trained on)."""

import os

import pytest
import torch
from dist_utils import close_gloo, init_gloo, make_rollout_batch, spawn_ranks

from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.lora import LoraSpec
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob
from rlcore.workers.common import mini_batch_counts, run_forward

pytestmark = pytest.mark.numerics  # compares floats across layouts: re-run under other CPU kernels (make test-numerics)

ROWS, MICRO_ROWS = 8, 4  # samples, and samples per micro-batch of the sp=2 engine (sp=1: half of each, per rank)


def build_tied_qwen2_dir(path: str) -> str:
    from conftest import build_tiny_model_dir
    from transformers import AutoConfig, AutoModelForCausalLM

    build_tiny_model_dir(path, seed=3)
    config = AutoConfig.from_pretrained(path)
    config.tie_word_embeddings = True
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def build_tiny_qwen3_dir(path: str) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlcore.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(2)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _tiny_moe_dir(path: str) -> str:
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import build_model_dir

    return build_model_dir(path, "tiny-qwen3-moe", build_char_tokenizer())


def _loss(engine, data):
    """Token-mean NLL minus an entropy bonus over the rank's samples, normalised by the data-parallel group's
    tokens and scaled by dp (gradients are averaged), as the actor's loss."""
    tokens, _ = mini_batch_counts(data.batch["response_mask"], engine)

    def loss_fn(outputs, mb):
        mask = mb.batch["response_mask"]
        total = -((outputs["log_probs"] + 0.01 * outputs["entropy"]) * mask).sum() / tokens * engine.dp_size
        return total, {"loss": total.detach()}
    return loss_fn


def _run(engine, data, rows):
    from rlcore.engine.base import TokenRequest

    spec = MicroBatchSpec(rows=rows, packed=True)
    out = compute_log_prob(engine, data, spec, temperature=0.7, with_entropy=True).batch
    micro = data.split(rows)
    metrics = engine.forward_backward(micro, _loss(engine, data), TokenRequest(0.7, True))
    grads = [p.grad.full_tensor().clone() for p in engine.model.parameters() if p.grad is not None]
    step = engine.optimizer_step()
    return {"log_probs": out["log_probs"], "entropys": out["entropys"], "loss": sum(m["loss"] for m in metrics),
            "grads": grads, "grad_norm": step["grad_norm"]}


def _run_routes(engine, data, rows):
    """A mixture of experts' routes under Ulysses: those a free forward records (each rank routed its slice, gathered),
    then forced routes no router would pick, replayed in a forward and in the update (each rank forcing its slice)."""
    from rlcore.engine.base import TokenRequest
    from rlcore.models.router import ROUTES

    micro = data.split(rows)
    recorded = torch.cat([o[ROUTES] for o in engine.forward(micro, lambda out, mb: {ROUTES: out[ROUTES]}, TokenRequest(routes="record"))])
    ids = data.batch["input_ids"]
    layers, k, experts = 2, 2, 8  # tiny-qwen3-moe
    # From each token's id and column, not its row: sp=1's halves and sp=2's whole batch force the same routes.
    forced = (ids[:, :, None, None] + torch.arange(ids.shape[1])[None, :, None, None] + torch.arange(layers)[None, None, :, None]
              + torch.arange(k)) % experts
    data = DataProto.from_dict({**{k: v for k, v in data.batch.items()}, ROUTES: forced.to(torch.int16)})
    micro = data.split(rows)
    replay = TokenRequest(0.7, True, routes="replay")
    replayed = torch.cat([o["lp"] for o in engine.forward(micro, lambda out, mb: {"lp": out["log_probs"]}, replay)])
    metrics = engine.forward_backward(micro, _loss(engine, data), replay)
    grads = [p.grad.full_tensor().clone() for p in engine.model.parameters() if p.grad is not None]
    return {"routes": recorded, "log_probs": replayed, "loss": sum(m["loss"] for m in metrics), "grads": grads,
            "grad_norm": engine.optimizer_step()["grad_norm"]}


def rollout_batch():
    batch = make_rollout_batch(ROWS, 7, 9, 60, seed=11)
    batch["response_mask"][::2, 1:3] = 0  # a tool's output inside the response: attended to, not trained on
    return batch


VARIANTS = {"qwen2": {}, "qwen2_ckpt": {"gradient_checkpointing": True}, "qwen2_lora": {"lora": LoraSpec(4, 8)}, "qwen2tied": {},
            "llama": {}, "qwen3": {}, "qwen3moe": {},  # qwen3moe: a mixture of experts, each rank routing its slice
            "qwen3moe_replay": {}}  # its routes recorded and forced (router replay), each rank its slice


def _rank_main(rank, world, port, dirs, out_dir):
    init_gloo(rank, world, port)
    data = DataProto.from_dict(rollout_batch())
    mine = data.split(ROWS // 2)[rank]  # sp=1: each rank its half of the samples
    results = {}
    for variant, extra in VARIANTS.items():
        runs = {}
        for sp, share, rows in ((1, mine, MICRO_ROWS // 2), (2, data, MICRO_ROWS)):
            torch.manual_seed(0)  # LoRA's adapters are initialised at build: the same for both
            spec = EngineSpec(model_path=dirs[variant.split("_")[0]], use_remove_padding=True, lr=1e-3, ulysses_sp=sp, **extra)
            engine = FSDP2Engine(spec, torch.device("cpu"))
            assert (engine.dp_size, engine.dp_rank) == ((2, rank) if sp == 1 else (1, 0))
            runs[sp] = (_run_routes if variant == "qwen3moe_replay" else _run)(engine, share, rows)
        results[variant] = runs
    values = {}
    for kind in ("value", "reward"):  # a critic reads its head before each response token, a reward model at it
        for sp, share, rows in ((1, mine, 2), (2, data, 4)):
            torch.manual_seed(0)  # the scalar head is initialised at build: the same for both
            engine = FSDP2Engine(EngineSpec(model_path=dirs["qwen2"], kind=kind, use_remove_padding=True, ulysses_sp=sp), torch.device("cpu"))
            spec = MicroBatchSpec(rows=rows, packed=True)
            values[kind, sp] = run_forward(engine, share, spec, lambda outputs, mb: {"v": next(iter(outputs.values()))}).batch["v"]
    torch.save({"results": results, "values": values}, os.path.join(out_dir, f"rank{rank}.pt"))
    close_gloo()


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    from conftest import build_tiny_llama_dir, build_tiny_model_dir

    root = tmp_path_factory.mktemp("ulysses")
    dirs = {"qwen2": build_tiny_model_dir(str(root / "qwen2")), "qwen2tied": build_tied_qwen2_dir(str(root / "qwen2tied")),
            "llama": build_tiny_llama_dir(str(root / "llama")),
            "qwen3": build_tiny_qwen3_dir(str(root / "qwen3")), "qwen3moe": _tiny_moe_dir(str(root / "qwen3moe"))}
    spawn_ranks(_rank_main, 2, lambda port: (2, port, dirs, str(root)))
    return [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_micro_batches_have_odd_packed_lengths():
    data = rollout_batch()
    lengths = data["attention_mask"].sum(-1).reshape(-1, MICRO_ROWS).sum(-1)
    assert (lengths % 2 == 1).any(), lengths  # the sp=2 engine pads at least one packed row


def test_router_replay_under_sp2_equals_sp1(parity):
    """Recorded routes (every real token) and, under forced routes, log-probs, the loss and the gradient."""
    ranks = [p["results"]["qwen3moe_replay"] for p in parity]
    batch = make_rollout_batch(ROWS, 7, 9, 60, seed=11)
    real, response = batch["attention_mask"].bool(), batch["response_mask"].bool()
    sp1 = {key: torch.cat([r[1][key] for r in ranks]) for key in ("routes", "log_probs")}
    for r in ranks:
        assert torch.equal(r[2]["routes"][real], sp1["routes"][real])
        torch.testing.assert_close(r[2]["log_probs"][response], sp1["log_probs"][response], atol=1e-5, rtol=0)
    assert ranks[0][2]["loss"] == pytest.approx(sum(r[1]["loss"] for r in ranks) / 2, abs=1e-5)
    for a, b in zip(ranks[0][2]["grads"], ranks[0][1]["grads"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert ranks[0][2]["grad_norm"] == pytest.approx(ranks[0][1]["grad_norm"], abs=1e-5)
    free = parity[0]["results"]["qwen3moe"][2]["log_probs"]  # the same model and batch, routing freely
    assert (ranks[0][2]["log_probs"][response] - free[response]).abs().max() > 1e-3  # the forced routes took effect


@pytest.mark.parametrize("model", [v for v in VARIANTS if v != "qwen3moe_replay"])
def test_sp2_equals_sp1(parity, model):
    ranks = [p["results"][model] for p in parity]
    mask = make_rollout_batch(ROWS, 7, 9, 60, seed=11)["response_mask"].bool()  # every response token (holes included)
    diffs = {}
    for key in ("log_probs", "entropys"):
        sp1 = torch.cat([r[1][key] for r in ranks])  # the two halves, in sample order
        for r in ranks:  # every rank of the sp group holds the whole result
            diffs[key] = (r[2][key][mask] - sp1[mask]).abs().max().item()
            torch.testing.assert_close(r[2][key][mask], sp1[mask], atol=1e-5, rtol=0)
    # The loss: sp=1's is the sum of the two ranks' shares; each sp=2 rank computes the whole of it.
    assert ranks[0][2]["loss"] == pytest.approx(ranks[1][2]["loss"], abs=0)
    sp1_loss = sum(r[1]["loss"] for r in ranks) / 2  # each rank's metric is its dp-scaled share: mean over ranks
    assert ranks[0][2]["loss"] == pytest.approx(sp1_loss, abs=1e-5)
    diffs["grads"] = max((a - b).abs().max().item() for a, b in zip(ranks[0][2]["grads"], ranks[0][1]["grads"]))
    for a, b in zip(ranks[0][2]["grads"], ranks[0][1]["grads"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert ranks[0][2]["grad_norm"] == pytest.approx(ranks[0][1]["grad_norm"], abs=1e-5)
    print(f"{model}: max |sp2 - sp1|", {k: f"{v:.1e}" for k, v in diffs.items()})


@pytest.mark.parametrize("kind", ["value", "reward"])
def test_values_and_scores_sp2_equal_sp1(parity, kind):
    mask = rollout_batch()["attention_mask"][:, -9:].bool()  # every response token
    sp1 = torch.cat([p["values"][kind, 1] for p in parity])
    for p in parity:
        torch.testing.assert_close(p["values"][kind, 2][mask], sp1[mask], atol=1e-5, rtol=0)
    print(f"{kind}: max |sp2 - sp1| {(parity[0]['values'][kind, 2] - sp1)[mask].abs().max().item():.1e}")
