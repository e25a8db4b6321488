"""Qwen3-Next (80B-A3B): Qwen3.5's hybrid of Gated DeltaNet and gated full attention, with routed experts and a
gated shared expert in every layer."""

from rlcore.families.arch import arch as make_arch
from rlcore.families.arch import swiglu, text_config
from rlcore.families.base import Family
from rlcore.families.linear_attention import hybrid_blocks
from rlcore.families.qwen3_5_text import HYBRID_MEGATRON, HYBRID_TINY, HYBRID_VLLM_CPU_DTYPE
from rlcore.families.qwen_moe import ROUTER, qwen_moe_problems


def arch(config, name):
    c = text_config(config)
    h, s, experts = c["hidden_size"], c.get("shared_expert_intermediate_size") or 0, c["num_experts"]
    shared = swiglu(h, s) + ((h, 1),) if s else ()
    routed = dict(experts=experts, expert_params=3 * h * c["moe_intermediate_size"], top_k=c["num_experts_per_tok"])
    blocks = hybrid_blocks(c, shared, experts * h, fused_qkvz=True, **routed)
    return make_arch(config, name, blocks, c["num_experts_per_tok"] * c["moe_intermediate_size"] + s)


FAMILY = Family(
    "qwen3_next", "Qwen3-Next (Qwen3.5's hybrid attention with routed + gated shared experts)", arch,
    tiny={"tiny-qwen3-next": dict(HYBRID_TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=64, norm_topk_prob=True)},
    router=ROUTER, megatron_missing=HYBRID_MEGATRON, recurrent="linear_attn", problems=qwen_moe_problems,
    vllm_cpu_dtype=HYBRID_VLLM_CPU_DTYPE)
