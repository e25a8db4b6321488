"""The model families rlcore runs, and the reason a config.json outside them is refused before Ray starts.

Pure Python over a raw config.json dict (no torch): the driver checks every model of a run before it starts a
process, so a model that would fail inside a worker (or, worse, run wrong) is named with the reason up front.
Each family here goes through a whole GRPO step in the CPU suite (tests/workers/test_model_families.py). It sits
with the plan's architecture table (rlcore.plan.arch), the lowest layer that reads it: the engines, the rollout and
the doctor all read the family facts from here.
"""

from __future__ import annotations

import json
import os
from typing import Any

# model_type -> what rlcore runs of it (all decoder-only, SwiGLU, RMSNorm, RoPE)
FAMILIES = {
    "qwen2": "Qwen2 / Qwen2.5 (q/k/v biases; tied embeddings at 0.5B-3B)",
    "qwen3": "Qwen3 dense (q/k RMSNorm, no biases; tied embeddings at 0.6B-4B)",
    "llama": "Llama 3 / 3.1 / 3.2 (llama3 RoPE scaling; tied embeddings at 1B and 3B)",
    "qwen3_moe": "Qwen3-MoE (30B-A3B, 235B-A22B: top-k routed experts, q/k RMSNorm)",
    "qwen2_moe": "Qwen1.5-MoE / Qwen2-MoE (routed experts plus a gated shared expert, q/k/v biases)",
}
# The mixtures of experts among them: FSDP2 shards their experts over its ranks, megatron-core's MoE layers split them
# over expert-parallel ranks (rlcore.engine.megatron.moe); the native rollout and vLLM run them.
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe")
# megatron-core's built-in Llama 3.1 RoPE scaling (GPTModel(rope_scaling=True)) has these fixed parameters.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE type, theta and scaling as one dict, from transformers 5's `rope_parameters` or the older
    `rope_theta` + `rope_scaling` keys that most published checkpoints still carry."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def megatron_rope(config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, GPTModel RoPE-scaling kwargs); a scaling megatron-core cannot express raises ValueError."""
    params = rope_parameters(config)
    theta, kind = params["rope_theta"], params["rope_type"]
    if kind == "default":
        return theta, {}
    if kind == "llama3" and all(params.get(k) == v for k, v in LLAMA3_ROPE.items()):
        return theta, {"rope_scaling": True, "rope_scaling_factor": params["factor"]}
    raise ValueError(f"{config.get('model_type')} RoPE scaling {params} has no megatron-core equivalent; use strategy=fsdp2 for this model")


def family_problems(config: dict[str, Any], strategy: str) -> list[str]:
    """Why rlcore cannot train this architecture with `strategy` (fsdp/fsdp2/megatron); empty when it can."""
    model_type = config.get("model_type")
    if "vision_config" in config or "text_config" in config:
        return [f"model_type={model_type!r} is multimodal; rlcore trains text-only causal LMs ({', '.join(FAMILIES)})"]
    if model_type not in MOE_FAMILIES and any(config.get(k) for k in _MOE_KEYS):
        return [f"model_type={model_type!r} is a mixture of experts rlcore has not run (its MoE families: {', '.join(MOE_FAMILIES)})"]
    if model_type not in FAMILIES:
        known = "; ".join(f"{k}: {v}" for k, v in FAMILIES.items())
        return [f"model_type={model_type!r} is not a family rlcore has run through its engines and rollout (known: {known})"]
    problems = []
    if config.get("use_sliding_window"):
        problems.append(f"{model_type} with use_sliding_window=true: neither the native rollout nor packed training "
                        "implements sliding-window attention; set it to false in config.json (full attention)")
    if config.get("mlp_bias"):
        problems.append(f"{model_type} with mlp_bias=true: rlcore's fused decode path and megatron converter assume bias-free MLPs")
    if model_type in MOE_FAMILIES:
        problems += moe_problems(config, strategy)
    elif strategy == "megatron":
        try:
            megatron_rope(config)
        except ValueError as err:
            problems.append(str(err))
    return problems


def is_moe(config: dict[str, Any]) -> bool:
    return config.get("model_type") in MOE_FAMILIES


def num_experts(config: dict[str, Any]) -> int:
    """Routed experts per layer of a MoE family's config.json (transformers 5 writes `num_local_experts`, the
    published checkpoints `num_experts`); 0 for a dense model."""
    return (config.get("num_local_experts") or config.get("num_experts") or 0) if is_moe(config) else 0


def moe_problems(config: dict[str, Any], strategy: str) -> list[str]:
    """What rlcore cannot run of a MoE family's config with `strategy`."""
    model_type = config.get("model_type")
    problems = []
    if strategy == "megatron":  # megatron-core's MoE layers (rlcore.engine.megatron.moe), with expert parallelism
        try:
            megatron_rope(config)
        except ValueError as err:
            problems.append(str(err))
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        problems.append(f"{model_type} with dense layers among the MoE ones (mlp_only_layers={config.get('mlp_only_layers')}, "
                        f"decoder_sparse_step={config.get('decoder_sparse_step')}): rlcore's router bookkeeping assumes every layer "
                        "routes, as in every published Qwen MoE; set mlp_only_layers=[] and decoder_sparse_step=1")
    if num_experts(config) > 32767:
        problems.append(f"{model_type} with {num_experts(config)} experts: routes are carried as int16")
    return problems


def check_model_dir(path: str, strategy: str, key: str) -> list[str]:
    """family_problems of the config.json in `path`, each naming the config key that points at it."""
    config_file = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(config_file):
        return []  # resolve_model_path reports a missing directory with its own fix
    with open(config_file) as f:
        config = json.load(f)
    return [f"{key}={path}: {problem}" for problem in family_problems(config, strategy)]
