"""Seed-OSS (36B): Llama's block with q/k/v biases (attention_bias), no o bias unless attention_out_bias."""

from rlcore.families.arch import dense_arch, head_dim, kv_head_count, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.tiny import TINY


def arch(config, name):
    c = text_config(config)
    bias = (c["num_attention_heads"] + 2 * kv_head_count(c)) * head_dim(c) if c.get("attention_bias", True) else 0
    bias += c["hidden_size"] if c.get("attention_out_bias") else 0
    return dense_arch(config, name, attention_other=bias, mlp_bias=bool(c.get("mlp_bias")))


def problems(config, strategy):
    c = text_config(config)
    if strategy == "megatron" and (c.get("attention_out_bias") or c.get("mlp_bias")):
        return ["seed_oss with attention_out_bias or mlp_bias: rlcore's megatron-core build has biases on q/k/v only; use strategy=fsdp2"]
    return []


FAMILY = Family(
    "seed_oss", "Seed-OSS (q/k/v biases, head_dim 128)", arch,
    tiny={"tiny-seed-oss": dict(TINY, head_dim=32, attention_bias=True, attention_out_bias=False, attention_dropout=0.0,
                                residual_dropout=0.0, tie_word_embeddings=False, max_position_embeddings=64)},
    megatron=Megatron(qkv_bias=True), problems=problems)
