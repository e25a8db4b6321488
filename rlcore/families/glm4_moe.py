"""GLM-4.5 / 4.6 (355B-A32B, Air 106B-A12B): grouped-query attention with q/k/v biases, optional q/k RMSNorm and a
partial RoPE; the first layer dense, then a shared expert and routed experts under DeepSeek-V3's biased sigmoid router."""

from rlcore.families.arch import gqa_linears, head_dim, kv_head_count, text_config
from rlcore.families.base import Family, Megatron, Router
from rlcore.families.deepseek_v3 import deepseek_moe_arch, router_fields, router_problems


def arch(config, name):
    c = text_config(config)
    d, kv = head_dim(c), kv_head_count(c)
    bias = (c["num_attention_heads"] + 2 * kv) * d if c.get("attention_bias") else 0
    other = bias + (2 * d if c.get("use_qk_norm") else 0)
    return deepseek_moe_arch(config, name, gqa_linears(c), other, dict(kv_heads=kv, kv_dims=2 * d), kv_heads=kv)


def megatron_fields(config) -> dict:
    """Llama's block with q/k/v biases (config.json's attention_bias) and q/k norms when use_qk_norm; DeepSeek's router.
    The partial RoPE is GPTModel's rotary_percent (rlcore.families.megatron_rope)."""
    c = text_config(config)
    return dict(qk_layernorm=bool(c.get("use_qk_norm")), **router_fields(c))


def problems(config, strategy):
    return router_problems(text_config(config)) if strategy == "megatron" else []


FAMILY = Family(
    "glm4_moe", "GLM-4.5 / 4.6 (q/k/v biases, partial RoPE; first layer dense, shared + routed experts, biased sigmoid router)",
    arch,
    tiny={"tiny-glm4-moe": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, use_qk_norm=True,
                                attention_bias=True, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                moe_intermediate_size=32, first_k_dense_replace=1, n_group=2, topk_group=1,
                                routed_scaling_factor=2.0, norm_topk_prob=True, tie_word_embeddings=False,
                                max_position_embeddings=64)},
    router=Router(module="mlp.gate", scoring="sigmoid", aux_loss=False),
    megatron=Megatron(shared_experts="mlp.shared_experts", fields=megatron_fields), problems=problems)
