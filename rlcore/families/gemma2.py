"""Gemma 2 (2B, 9B, 27B): sliding and global layers alternating, tanh soft-capping of the attention logits and of the
final logits, four norms per block (`1 + weight`), embeddings scaled by sqrt(hidden), tied head."""

from rlcore.families.arch import dense_arch, qkv_bias, text_config
from rlcore.families.base import Family

GEMMA_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, query_pre_attn_scalar=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                  max_position_embeddings=64)
# What megatron-core's GPT layer cannot express of the Gemma block (read in megatron-core 0.16.1).
GEMMA_MEGATRON = ("megatron-core's GPT block has no post-attention / post-MLP norms, no logit soft-capping and one RoPE "
                  "base per model")


def arch(config, name):
    c = text_config(config)
    return dense_arch(config, name, attention_other=qkv_bias(c, out=True) if c.get("attention_bias") else 0, norms=4,
                      tied_default=True)


FAMILY = Family(
    "gemma2", "Gemma 2 (sliding + global layers, attention and final logit soft-capping)", arch,
    # Caps low enough to bend a tiny random model's logits (the published 50 / 30 would leave them linear)
    tiny={"tiny-gemma2": dict(GEMMA_TINY, attn_logit_softcapping=1.0, final_logit_softcapping=0.5)},
    megatron_missing=GEMMA_MEGATRON)
