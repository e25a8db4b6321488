"""Llama 3 / 3.1 / 3.2: the plain block (GQA, SwiGLU, RMSNorm), llama3 RoPE scaling; tied embeddings at 1B and 3B."""

from rlcore.families.arch import dense_arch, qkv_bias, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.tiny import TINY

# Llama 3.1 / 3.2's RoPE scaling (factor 8 at 8B/70B, 32 at 1B/3B), as in their config.json.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def arch(config, name):
    c = text_config(config)
    return dense_arch(config, name, attention_other=qkv_bias(c, out=True) if c.get("attention_bias") else 0,
                      mlp_bias=bool(c.get("mlp_bias")))


def problems(config, strategy):
    c = text_config(config)
    if strategy == "megatron" and (c.get("mlp_bias") or c.get("attention_bias")):
        return ["llama with mlp_bias or attention_bias: rlcore's megatron-core build has bias-free MLPs and no o_proj bias; "
                "use strategy=fsdp2"]
    return []


FAMILY = Family(
    "llama", "Llama 3 / 3.1 / 3.2 (llama3 RoPE scaling; tied embeddings at 1B and 3B)", arch,
    tiny={"tiny-llama3.2": dict(TINY, tie_word_embeddings=True, max_position_embeddings=131072, rope_parameters=dict(LLAMA3_ROPE, factor=32.0)),
          "tiny-llama3.1": dict(TINY, tie_word_embeddings=False, max_position_embeddings=131072, rope_parameters=dict(LLAMA3_ROPE, factor=8.0))},
    megatron=Megatron(), fused_decode=True, problems=problems)
