"""Model architectures for the memory plan: read from a model directory's config.json, or a built-in table of
published shapes.

The counts come from the model's family module (rlcore.families: exact for every family rlcore has a module for,
estimated as Llama's block otherwise). The table lets `rlcore-plan` size a 72B run on a laptop that has no weights:
`model.path=~/models/Qwen2.5-72B` resolves by name when the directory does not exist. Its entries are the published
config.json's shape keys, so an entry is planned, and rehearsed (rlcore.cli.rehearsal builds the model from it on
fake tensors), exactly as the real checkpoint's config.json would be. Imports neither torch nor ray.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from rlcore.families import arch_of
from rlcore.families.arch import Arch
from rlcore.families.llama import LLAMA3_ROPE


def _qwen2(hidden, layers, heads, kv, inter, tied, vocab=152064):
    return dict(model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=inter, vocab_size=vocab, max_position_embeddings=32768, tie_word_embeddings=tied)


def _qwen3(hidden, layers, heads, inter, tied):
    return dict(model_type="qwen3", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                head_dim=128, intermediate_size=inter, vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=tied)


def _llama(hidden, layers, heads, kv, inter, tied=False, max_positions=8192):
    return dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=inter, vocab_size=128256, max_position_embeddings=max_positions, tie_word_embeddings=tied,
                **({"rope_parameters": dict(LLAMA3_ROPE, rope_type="llama3", rope_theta=500000.0, factor=8.0)} if max_positions > 8192 else {}))


def _gemma2(hidden, layers, heads, kv, head_dim, inter):
    return dict(model_type="gemma2", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                head_dim=head_dim, query_pre_attn_scalar=head_dim, intermediate_size=inter, vocab_size=256000,
                max_position_embeddings=8192, sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                layer_types=["sliding_attention", "full_attention"] * (layers // 2), tie_word_embeddings=True)


def _gpt_oss(layers, experts):
    return dict(model_type="gpt_oss", hidden_size=2880, num_hidden_layers=layers, num_attention_heads=64, num_key_value_heads=8,
                head_dim=64, intermediate_size=2880, num_local_experts=experts, num_experts_per_tok=4, vocab_size=201088,
                max_position_embeddings=131072, sliding_window=128, tie_word_embeddings=False,
                layer_types=["sliding_attention", "full_attention"] * (layers // 2))


def _moe(model_type, hidden, layers, heads, kv, inter, experts, top_k, moe_inter, **extra):
    return dict(model_type=model_type, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=inter, num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=moe_inter,
                vocab_size=151936, tie_word_embeddings=False, **extra)


def _deepseek_v3(hidden, layers, heads, q_rank, inter, moe_inter, experts, top_k, dense, vocab, groups, **extra):
    return dict(model_type="deepseek_v3", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=heads, q_lora_rank=q_rank, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                v_head_dim=128, intermediate_size=inter, moe_intermediate_size=moe_inter, n_routed_experts=experts,
                num_experts_per_tok=top_k, first_k_dense_replace=dense, vocab_size=vocab, n_group=groups,
                tie_word_embeddings=False, **extra)


def _qwen2_5_vl(hidden, layers, heads, kv, inter, tied):
    """Qwen2.5-VL: a Qwen2.5 language model (its text_config) and the same 32-block ViT tower at every size."""
    text = dict(_qwen2(hidden, layers, heads, kv, inter, tied, vocab=151936 if tied else 152064), model_type="qwen2_5_vl_text",
                max_position_embeddings=128000)
    tower = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=hidden, patch_size=14,
                 spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    return dict(model_type="qwen2_5_vl", text_config=text, vision_config=tower, tie_word_embeddings=tied)


# Shapes from each model's published config.json. Qwen2 and Qwen2.5 share shapes at a given size.
_TABLE: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(896, 24, 14, 2, 4864, True, vocab=151936),
    "qwen2.5-1.5b": _qwen2(1536, 28, 12, 2, 8960, True, vocab=151936),
    "qwen2.5-3b": _qwen2(2048, 36, 16, 2, 11008, True, vocab=151936),
    "qwen2.5-7b": _qwen2(3584, 28, 28, 4, 18944, False),
    "qwen2.5-14b": _qwen2(5120, 48, 40, 8, 13824, False),
    "qwen2.5-32b": _qwen2(5120, 64, 40, 8, 27648, False),
    "qwen2.5-72b": _qwen2(8192, 80, 64, 8, 29568, False),
    "qwen2.5-vl-3b": _qwen2_5_vl(2048, 36, 16, 2, 11008, True),
    "qwen2.5-vl-7b": _qwen2_5_vl(3584, 28, 28, 4, 18944, False),
    "qwen3-0.6b": _qwen3(1024, 28, 16, 3072, True),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 6144, True),
    "qwen3-4b": _qwen3(2560, 36, 32, 9728, True),
    "qwen3-8b": _qwen3(4096, 36, 32, 12288, False),
    "qwen3-14b": _qwen3(5120, 40, 40, 17408, False),
    "qwen3-32b": _qwen3(5120, 64, 64, 25600, False),
    "llama3-8b": _llama(4096, 32, 32, 8, 14336),
    "llama3-70b": _llama(8192, 80, 64, 8, 28672),
    # Llama 3.1 has Llama 3's shapes with a 128K context; 3.2's 1B and 3B tie their embeddings.
    "llama3.1-8b": _llama(4096, 32, 32, 8, 14336, max_positions=131072),
    "llama3.1-70b": _llama(8192, 80, 64, 8, 28672, max_positions=131072),
    "llama3.2-1b": _llama(2048, 16, 32, 8, 8192, tied=True, max_positions=131072),
    "llama3.2-3b": _llama(3072, 28, 24, 8, 8192, tied=True, max_positions=131072),
    "deepseek-llm-7b": dict(_llama(4096, 30, 32, 32, 11008, max_positions=4096), vocab_size=102400),
    # Mixtures of experts, named <total>-a<active>: 30.5B / 3.3B active, 235B / 22B, 14.3B / 2.7B, 57B / 14B.
    "qwen3-30b-a3b": _moe("qwen3_moe", 2048, 48, 32, 4, 6144, 128, 8, 768, head_dim=128, max_position_embeddings=40960, norm_topk_prob=True),
    "qwen3-235b-a22b": _moe("qwen3_moe", 4096, 94, 64, 4, 12288, 128, 8, 1536, head_dim=128, max_position_embeddings=40960, norm_topk_prob=True),
    "qwen1.5-moe-a2.7b": _moe("qwen2_moe", 2048, 24, 16, 16, 5632, 60, 4, 1408, shared_expert_intermediate_size=5632,
                              max_position_embeddings=8192),
    "qwen2-57b-a14b": _moe("qwen2_moe", 3584, 28, 28, 4, 18944, 64, 8, 2560, shared_expert_intermediate_size=20480,
                           max_position_embeddings=32768),
    # The families of verl's newer example scripts.
    "gemma-2-2b": _gemma2(2304, 26, 8, 4, 256, 9216),
    "gemma-2-9b": _gemma2(3584, 42, 16, 8, 256, 14336),
    "gemma-2-27b": _gemma2(4608, 46, 32, 16, 128, 36864),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=14336, vocab_size=32768, max_position_embeddings=32768, sliding_window=None,
                       tie_word_embeddings=False),
    "mistral-nemo-12b": dict(model_type="mistral", hidden_size=5120, num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, intermediate_size=14336, vocab_size=131072, max_position_embeddings=1024000,
                             sliding_window=None, tie_word_embeddings=False),
    "moonlight-16b-a3b": _deepseek_v3(2048, 27, 16, None, 11264, 1408, 64, 6, 1, 163840, 1, n_shared_experts=2, topk_group=1,
                                      routed_scaling_factor=2.446, max_position_embeddings=8192),
    "deepseek-v3": _deepseek_v3(7168, 61, 128, 1536, 18432, 2048, 256, 8, 3, 129280, 8, n_shared_experts=1, topk_group=4,
                                routed_scaling_factor=2.5, max_position_embeddings=163840),
    "gpt-oss-20b": _gpt_oss(24, 32),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "seed-oss-36b": dict(model_type="seed_oss", hidden_size=5120, num_hidden_layers=64, num_attention_heads=80, num_key_value_heads=8,
                         head_dim=128, intermediate_size=27648, vocab_size=155136, max_position_embeddings=524288,
                         attention_bias=True, attention_out_bias=False, tie_word_embeddings=False),
}
BUILTIN: dict[str, Arch] = {name: arch_of(config, name) for name, config in _TABLE.items()}
_QWEN2_SIZES = ("0.5b", "1.5b", "7b", "72b")  # Qwen2 came in these sizes; 2.5 added 3b, 14b, 32b


def builtin_arch(name: str) -> Optional[Arch]:
    """Matches a model name or path like `Qwen/Qwen2-7B-Instruct`, `~/models/Meta-Llama-3.1-70B` or
    `deepseek-llm-7b-chat` to the table; None when nothing matches."""
    base = os.path.basename(os.path.normpath(os.path.expanduser(name))).lower()
    named = _by_family_name(base)
    if named is not None:
        return BUILTIN.get(named)
    moe = re.search(r"(qwen[\d.]+)-(?:moe-)?(?:(\d+)b-)?a(\d+(?:\.\d+)?)b", base)
    if moe:  # Qwen3-30B-A3B, Qwen2-57B-A14B-Instruct, Qwen1.5-MoE-A2.7B-Chat
        family, total, active = moe.groups()
        return BUILTIN.get(f"{family}-{total}b-a{active}b" if total else f"{family}-moe-a{active}b")
    minor = re.search(r"llama-?3\.(\d)", base)
    base = re.sub(r"llama-?3(\.\d)?", "llama3", base)
    size = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])", base)
    if not size:
        return None
    size = size.group(1) + "b"
    if "qwen2.5-vl" in base:  # before the language models of the same size
        return BUILTIN.get(f"qwen2.5-vl-{size}")
    if "qwen2" in base and ("qwen2.5" in base or size in _QWEN2_SIZES):
        return BUILTIN.get(f"qwen2.5-{size}")
    if "qwen3" in base:
        return BUILTIN.get(f"qwen3-{size}")
    if "llama3" in base:
        version = f"llama3.{minor.group(1)}" if minor else "llama3"
        return BUILTIN.get(f"{version}-{size}") or BUILTIN.get(f"llama3-{size}")
    if "deepseek-llm" in base:
        return BUILTIN.get(f"deepseek-llm-{size}")
    if "gemma-2" in base:
        return BUILTIN.get(f"gemma-2-{size}")
    if "gpt-oss" in base:
        return BUILTIN.get(f"gpt-oss-{size}")
    if "seed-oss" in base:
        return BUILTIN.get(f"seed-oss-{size}")
    if "mistral" in base and "nemo" not in base:
        return BUILTIN.get(f"mistral-{size}")
    return None


def _by_family_name(base: str) -> Optional[str]:
    """Table entries named without a size the size pattern reads: Mistral-Nemo, Moonlight, DeepSeek-V3."""
    for pattern, entry in ((r"mistral-nemo", "mistral-nemo-12b"), (r"moonlight-16b-a3b", "moonlight-16b-a3b"),
                           (r"deepseek-v3(?![.\d])|deepseek-v3\.[12]", "deepseek-v3")):
        if re.search(pattern, base):
            return entry
    return None


def arch_from_hf_config(config: dict, name: str) -> Arch:
    """Shapes from a raw HF config.json, through the model's family module (rlcore.families)."""
    return arch_of(config, name)


def hf_config(arch: Arch) -> dict:
    """A config.json for `arch` (transformers builds the model from its model_type), as the memory rehearsal does
    for a model named only by the built-in table."""
    return dict(arch.config)


def resolve_arch(path: str) -> tuple[Optional[Arch], str]:
    """(architecture, where it came from) for a model path: its config.json if the directory has one, else the
    built-in table by name; (None, reason) when neither knows it."""
    config_file = os.path.join(os.path.expanduser(path), "config.json")
    if os.path.isfile(config_file):
        with open(config_file) as f:
            config = json.load(f)
        try:
            return arch_from_hf_config(config, os.path.basename(os.path.normpath(path))), config_file
        except KeyError as missing:
            return None, f"{config_file} has no {missing}: not the config.json of a decoder-only causal LM"
    arch = builtin_arch(path)
    if arch is not None:
        return arch, f"built-in table ({arch.name}; no config.json at {path})"
    known = ", ".join(BUILTIN)
    return None, f"no config.json at {path} and the name matches no built-in architecture ({known})"
