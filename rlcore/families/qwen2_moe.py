"""Qwen1.5-MoE / Qwen2-MoE: routed experts (not renormalised) plus a shared expert behind a sigmoid gate, q/k/v biases."""

from rlcore.families.arch import qkv_bias, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.qwen_moe import ROUTER, qwen_moe_arch, qwen_moe_problems
from rlcore.families.tiny import TINY


def arch(config, name):
    c = text_config(config)
    return qwen_moe_arch(config, name, attention_other=qkv_bias(c, out=False), shared_width=c.get("shared_expert_intermediate_size") or 0)


FAMILY = Family(
    "qwen2_moe", "Qwen1.5-MoE / Qwen2-MoE (routed experts plus a gated shared expert, q/k/v biases)", arch,
    tiny={"tiny-qwen2-moe": dict(TINY, num_attention_heads=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False,
                                 tie_word_embeddings=False, max_position_embeddings=64)},
    router=ROUTER, megatron=Megatron(qkv_bias=True), problems=qwen_moe_problems)
