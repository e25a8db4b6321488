"""DeepSeek-V3 / Moonlight / Kimi-K2: multi-head latent attention (queries and keys/values through low-rank latents,
a RoPE part shared by every head, a value head dim of its own; the cache holds the latent), the first
`first_k_dense_replace` layers dense, the rest shared + routed experts under a sigmoid router whose bias chooses
experts (within `topk_group` of `n_group` groups) without weighing them."""

from rlcore.families.arch import Block, moe_block, swiglu, text_config
from rlcore.families.arch import arch as make_arch
from rlcore.families.base import Family, Megatron, Router


def mla(c) -> tuple[tuple, int, dict]:
    """(linears, other parameters, cache) of one MLA attention: the norms of its latents and its biases."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, kv_rank, q_rank = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"], c.get("q_lora_rank")
    q = ((h, q_rank), (q_rank, heads * (nope + rope))) if q_rank else ((h, heads * (nope + rope)),)
    linears = q + ((h, kv_rank + rope), (kv_rank, heads * (nope + v)), (heads * v, h))
    bias = ((q_rank or 0) + kv_rank + rope + h) if c.get("attention_bias") else 0  # q_a, kv_a and o projections
    return linears, (q_rank or 0) + kv_rank + bias, dict(kv_heads=1, kv_dims=kv_rank + rope)


def deepseek_moe_arch(config, name, attention: tuple, attention_other: int, cache: dict, kv_heads: int):
    """First-k-dense blocks, then MoE blocks with `n_shared_experts` shared experts (DeepSeek-V3, GLM-4.5)."""
    c = text_config(config)
    h, mi = c["hidden_size"], c["moe_intermediate_size"]
    dense = min(c.get("first_k_dense_replace") or 0, c["num_hidden_layers"])
    shared = swiglu(h, mi * c.get("n_shared_experts", 0)) if c.get("n_shared_experts") else ()
    other = attention_other + 2 * h
    blocks = [Block(dense, attention + swiglu(h, c["intermediate_size"]), other, **cache)] if dense else []
    blocks.append(moe_block(c, c["num_hidden_layers"] - dense, attention, other, shared=shared, **cache))
    return make_arch(config, name, blocks, c["num_experts_per_tok"] * mi + mi * c.get("n_shared_experts", 0), kv_heads=kv_heads)


def arch(config, name):
    c = text_config(config)
    linears, other, cache = mla(c)
    return deepseek_moe_arch(config, name, linears, other, cache, kv_heads=c["num_attention_heads"])


def problems(config, strategy):
    c = text_config(config)
    if c.get("n_routed_experts") and c.get("topk_method", "noaux_tc") != "noaux_tc":
        return [f"deepseek_v3 with topk_method={c['topk_method']}: transformers' DeepSeek-V3 routes by noaux_tc only"]
    return megatron_problems(c) if strategy == "megatron" else []


def megatron_problems(c) -> list[str]:
    """What megatron-core 0.16's MLA cannot express of this config (each would train another model)."""
    out, alternative = [], "; use actor_rollout_ref.actor.strategy=fsdp2"
    rope = _rope(c)
    if rope["rope_type"] not in ("default", "yarn"):
        out.append(f"deepseek_v3 with rope_type={rope['rope_type']}: megatron-core's MLA takes plain RoPE or YaRN{alternative}")
    if c.get("attention_bias"):
        out.append(f"deepseek_v3 with attention_bias=true: megatron-core's MLA projections have no biases{alternative}")
    return out + router_problems(c)


def router_problems(c) -> list[str]:
    """What megatron-core 0.16's router cannot express of a biased sigmoid router (DeepSeek-V3, GLM-4.5)."""
    out, alternative, model_type = [], "; use actor_rollout_ref.actor.strategy=fsdp2", c.get("model_type")
    if not c.get("n_routed_experts"):
        return out
    if not c.get("norm_topk_prob", True) and c["num_experts_per_tok"] > 1:
        out.append(f"{model_type} with norm_topk_prob=false: megatron-core's sigmoid router always renormalises its top-k{alternative}")
    groups, chosen = c.get("n_group") or 1, c.get("topk_group") or 1
    if groups > 1 and c["num_experts_per_tok"] // chosen != 2:
        # HF scores a group by its two best experts; megatron-core by its top-(k / topk_group)
        out.append(f"{model_type} with num_experts_per_tok={c['num_experts_per_tok']}, topk_group={chosen}: megatron-core scores "
                   f"an expert group by its top {c['num_experts_per_tok'] // chosen} experts where transformers uses 2{alternative}")
    return out


def router_fields(c) -> dict:
    """The first-k-dense layout and the biased sigmoid router as megatron-core names them (DeepSeek-V3, GLM-4.5)."""
    if not c.get("n_routed_experts"):
        return {}
    layers, dense = c["num_hidden_layers"], min(c.get("first_k_dense_replace") or 0, c["num_hidden_layers"])
    grouped = (c.get("n_group") or 1) > 1
    return dict(
        moe_layer_freq=[0] * dense + [1] * (layers - dense),
        moe_shared_expert_intermediate_size=c["moe_intermediate_size"] * c["n_shared_experts"] if c.get("n_shared_experts") else None,
        moe_shared_expert_gate=False,
        moe_router_score_function="sigmoid",
        moe_router_topk_scaling_factor=c.get("routed_scaling_factor") or None,
        moe_router_num_groups=c["n_group"] if grouped else None,
        moe_router_group_topk=c["topk_group"] if grouped else None,
        # the checkpoint's e_score_correction_bias chooses experts; HF never updates it, nor does rlcore's build
        moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)


def megatron_fields(config) -> dict:
    """MLA's dims and the router (rlcore.engine.megatron.model reads them)."""
    c = text_config(config)
    rope = _rope(c)
    if rope["rope_type"] == "yarn":  # DeepSeek-V3 and Kimi-K2; the softmax scale follows from mscale_all_dim on both sides
        positions = dict(rope_type="yarn", rotary_scaling_factor=rope["factor"], mscale=rope.get("mscale", 1.0),
                         mscale_all_dim=rope.get("mscale_all_dim", 0.0), beta_fast=rope.get("beta_fast", 32.0),
                         beta_slow=rope.get("beta_slow", 1.0), original_max_position_embeddings=rope["original_max_position_embeddings"])
    else:
        positions = dict(rope_type="rope", rotary_scaling_factor=1.0)
    return dict(multi_latent_attention=True, q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c["kv_lora_rank"],
                qk_head_dim=c["qk_nope_head_dim"], qk_pos_emb_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
                rotary_base=rope["rope_theta"], **positions, **router_fields(c))


def _rope(c) -> dict:
    """The RoPE parameters of a config.json (transformers 5's `rope_parameters`, or `rope_theta` + `rope_scaling`)."""
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    params.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


FAMILY = Family(
    "deepseek_v3", "DeepSeek-V3 / Moonlight / Kimi-K2 (MLA; first layers dense, then shared + routed experts under a biased sigmoid router)",
    arch,
    tiny={"tiny-deepseek-v3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                                   qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                                   n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=2,
                                   topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
                                   max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})},
    router=Router(module="mlp.gate", scoring="sigmoid", aux_loss=False),
    megatron=Megatron(latent_attention=True, shared_experts="mlp.shared_experts", fields=megatron_fields),
    # transformers 5 leaves these out of a saved config.json; vLLM then builds a softmax router without the bias
    vllm_config={"topk_method": "noaux_tc", "scoring_func": "sigmoid"},
    problems=problems)
