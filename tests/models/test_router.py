"""The routers of a mixture of experts under rlcore's hooks (rlcore/models/router.py), on every tiny MoE family
(Qwen's softmax routers, DeepSeek-V3's and GLM-4.5's biased sigmoid routers after a dense first layer, GPT-OSS's
top-k softmax): replay forces recorded routes after the router moved, the router still learns, replay of a
forward's own routes changes nothing, and the load-balancing loss and load metrics are HF's numbers."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.experts import expert_pieces, to_checkpoint_names
from rlcore.models.random_init import TINY_MOE, build_config
from rlcore.models.router import Routing, aux_loss, routers, to_routes


def tiny_moe(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(build_config(name, build_char_tokenizer()))


def batch(seed: int = 1, rows: int = 3, length: int = 12) -> torch.Tensor:
    return torch.randint(6, 90, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", TINY_MOE)
def test_replayed_routes_are_forced_after_the_router_moved_and_the_router_still_learns(name):
    model = tiny_moe(name)
    routing = Routing(model)
    ids = batch()
    with routing.run(record=True) as p:
        free = model(ids).logits
    recorded = to_routes(p.recorded, routing.num_layers)
    moe_layers = model.config.num_hidden_layers - (getattr(model.config, "first_k_dense_replace", 0) or 0)
    assert recorded.shape == (ids.numel(), moe_layers, 2) and recorded.dtype == torch.int16

    with routing.run(replay=recorded, record=True) as p:  # the same weights: replaying its own routes changes nothing
        assert torch.equal(model(ids).logits, free)
    with torch.no_grad():
        for router in routers(model):
            router.weight.add_(torch.randn_like(router.weight) * 0.5)
    with routing.run(record=True) as p:
        model(ids)
    moved = to_routes(p.recorded, routing.num_layers)
    assert (moved != recorded).any(), "the perturbation should change some routes"
    with routing.run(replay=recorded, record=True) as p:
        loss = model(ids).logits.logsumexp(-1).mean()
        loss.backward()
    assert torch.equal(to_routes(p.recorded, routing.num_layers), recorded)  # what the experts received
    assert all(router.weight.grad.abs().sum() > 0 for router in routers(model))  # scores come from the live softmax


def test_the_load_balancing_loss_is_hfs_and_the_metrics_count_every_valid_token():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = tiny_moe("tiny-qwen3-moe")
    routing = Routing(model)
    ids = batch(rows=2, length=10)
    with routing.run(aux=True, record=True, count=True) as p:
        out = model(ids, output_router_logits=True)
    hf = load_balancing_loss_func(out.router_logits, routing.num_experts, routing.top_k)
    torch.testing.assert_close(aux_loss(p.aux_losses, routing.num_experts), hf)
    metrics = routing.metrics()
    assert routing.metrics() == {}  # read and reset
    load = torch.stack([torch.bincount(p.recorded[i].reshape(-1).long(), minlength=8).double() for i in range(2)])
    for i in range(2):
        assert metrics[f"moe/load_max_over_mean/layer_{i}"] == pytest.approx(float(load[i].max() / load[i].mean()))
    assert 0 < metrics["moe/router_entropy"] <= float(torch.log(torch.tensor(8.0))) + 1e-6


def test_a_token_left_out_by_valid_neither_counts_nor_moves_the_loss():
    model = tiny_moe("tiny-qwen2-moe")
    routing = Routing(model)
    ids = batch(rows=1, length=8)
    valid = torch.ones(8, dtype=torch.bool)
    valid[:3] = False
    with routing.run(aux=True, record=True, count=True, valid=valid) as p:
        out = model(ids, output_router_logits=True)
    from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func

    mask = valid[None].long()
    hf = load_balancing_loss_func(out.router_logits, routing.num_experts, routing.top_k, mask)
    torch.testing.assert_close(aux_loss(p.aux_losses, routing.num_experts), hf)
    metrics = routing.metrics()
    load = torch.bincount(p.recorded[0][3:].reshape(-1).long(), minlength=8).double()
    assert metrics["moe/load_max_over_mean/layer_0"] == pytest.approx(float(load.max() / load.mean()))


def test_a_dense_model_has_no_routers_and_routing_says_so():
    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(build_config("tiny-qwen3", build_char_tokenizer()))
    assert routers(dense) == []
    with pytest.raises(ValueError, match="has no MoE router"):
        Routing(dense)


def test_fused_experts_split_into_the_checkpoint_names_and_back():
    model = tiny_moe("tiny-qwen2-moe")
    fused = dict(model.state_dict())
    split = dict(to_checkpoint_names(fused.items()))
    name = "model.layers.1.mlp.experts.gate_up_proj"
    assert name not in split and "model.layers.1.mlp.shared_expert.gate_proj.weight" in split
    for expert in range(8):
        rebuilt = torch.cat([split[piece] for piece, _, _ in expert_pieces(name, expert, fused[name].shape[1])])
        assert torch.equal(rebuilt, fused[name][expert])
    assert expert_pieces("model.layers.1.mlp.gate.weight", 0, 8) is None
