"""Random-initialised models of the families users start RL from, saved as real HF directories (no hub).

`tiny-*` shapes are for the CPU suite, each from its family's module (rlcore.families): each keeps what
distinguishes its family (Qwen2's q/k/v biases, tied embeddings, Qwen3's q/k RMSNorm, Llama 3.1/3.2's llama3 RoPE
scaling, Gemma's soft-capping and sliding layers, DeepSeek-V3's latent attention, ...). The published shapes
(`qwen2.5-0.5b`, `qwen3-0.6b`) are for GPU throughput runs (bench/gpu_step.py). Either is built over the
vocabulary of the tokenizer the caller passes (the tiny task's character tokenizer in rlcore's tests and benches).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rlcore.families import FAMILIES, TINY_SHAPES

# name -> (model_type, config kwargs): each family's tiny shapes (rlcore.families.<family>.FAMILY.tiny), then
# published shapes
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    **TINY_SHAPES,
    # Published shapes (their config.json on the hub), vocabulary from the tokenizer given.
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=32768,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3-30B-A3B's layer (its config.json), 8 of its 48 layers: a MoE decode shape one GPU holds (bench/moe_rollout.py).
    "qwen3-30b-a3b-l8": ("qwen3_moe", dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4,
                                           head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                           intermediate_size=6144, norm_topk_prob=True, tie_word_embeddings=False,
                                           max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}
TINY_FAMILIES = [name for name in SHAPES if name.startswith("tiny-")]
TINY_MOE = [name for name in TINY_FAMILIES if FAMILIES[SHAPES[name][0]].is_moe]


def build_config(shape: str, tokenizer, **overrides):
    """The config of `shape` over `tokenizer`'s vocabulary; `overrides` replace its keys (vLLM's CPU kernels want
    head dims of 32 and more, some checks the published values)."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; valid: {', '.join(SHAPES)}")
    model_type, kwargs = SHAPES[shape]
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **{**kwargs, **overrides})


def build_model_dir(path: str, shape: str, tokenizer, seed: int = 0, **overrides) -> str:
    """Writes a random-initialised `shape` model over `tokenizer`'s vocabulary, and the tokenizer, to `path`
    (the tiny task's: rlcore.data.tokenizer.build_char_tokenizer()); returns `path`. `overrides`: see build_config."""
    from transformers import AutoModelForCausalLM

    config = build_config(shape, tokenizer, **overrides)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.path.abspath(path)
