"""Qwen3 dense: q/k RMSNorm per head before RoPE, an explicit head_dim (its q projection is wider than the hidden
size at 0.6B-4B), no biases; tied embeddings at 0.6B-4B."""

from rlcore.families.arch import dense_arch, head_dim, qkv_bias, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.tiny import TINY


def arch(config, name):
    c = text_config(config)
    return dense_arch(config, name, attention_other=2 * head_dim(c) + (qkv_bias(c, out=True) if c.get("attention_bias") else 0))


FAMILY = Family(
    "qwen3", "Qwen3 dense (q/k RMSNorm, no biases; tied embeddings at 0.6B-4B)", arch,
    tiny={"tiny-qwen3": dict(TINY, head_dim=32, tie_word_embeddings=True, max_position_embeddings=64)},
    megatron=Megatron(qk_layernorm=True), fused_decode=True)
