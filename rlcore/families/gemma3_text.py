"""Gemma 3 text (1B; the language model of 4B-27B): five sliding layers per global one with their own RoPE base,
q/k RMSNorm, four norms per block, scaled embeddings, tied head."""

from rlcore.families.arch import dense_arch, head_dim, qkv_bias, text_config
from rlcore.families.base import Family
from rlcore.families.gemma2 import GEMMA_MEGATRON, GEMMA_TINY


def arch(config, name):
    c = text_config(config)
    bias = qkv_bias(c, out=True) if c.get("attention_bias") else 0
    return dense_arch(config, name, attention_other=2 * head_dim(c) + bias, norms=4, tied_default=True)


FAMILY = Family(
    "gemma3_text", "Gemma 3 text (5 sliding : 1 global layers, q/k RMSNorm, local and global RoPE bases)", arch,
    tiny={"tiny-gemma3": dict(GEMMA_TINY, rope_local_base_freq=10000.0)},
    megatron_missing=GEMMA_MEGATRON)
