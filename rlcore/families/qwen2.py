"""Qwen2 / Qwen2.5: Llama's block with q/k/v biases; tied embeddings at 0.5B-3B."""

from rlcore.families.arch import dense_arch, qkv_bias, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.tiny import TINY


def arch(config, name):
    return dense_arch(config, name, attention_other=qkv_bias(text_config(config), out=False))


def problems(config, strategy):
    c = text_config(config)
    if strategy == "megatron" and c.get("use_sliding_window"):
        return ["qwen2 with use_sliding_window=true: rlcore's megatron-core attention has no sliding window; use strategy=fsdp2 "
                "(or use_sliding_window=false in config.json, as every published Qwen2 / Qwen2.5 has)"]
    return []


FAMILY = Family(
    "qwen2", "Qwen2 / Qwen2.5 (q/k/v biases; tied embeddings at 0.5B-3B)", arch,
    tiny={"tiny-qwen2": dict(TINY, tie_word_embeddings=False, max_position_embeddings=64),
          "tiny-qwen2.5-tied": dict(TINY, tie_word_embeddings=True, max_position_embeddings=64)},
    megatron=Megatron(qkv_bias=True), fused_decode=True, problems=problems)
