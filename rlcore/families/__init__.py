"""The model families rlcore knows, one module each, and what a config.json may run on.

Any decoder-only causal LM that transformers ships trains on FSDP2 through HF's own modules and rolls out on vLLM
(the generic path); a family module (rlcore/families/<model_type>.py) adds what that path cannot know (exact counts
for the plan, a MoE router, a megatron-core build, the native fused decode). Adding a family is adding its module
and listing it below. The driver checks every model of a run here before it starts a process, so a model that would
fail inside a worker, or run wrong, is named with the reason and the alternative up front. Pure Python: no torch
(transformers' list of causal LMs is read only for a model_type without a module).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlcore.families import (
    deepseek_v3,
    gemma2,
    gemma3_text,
    glm4_moe,
    gpt_oss,
    llama,
    mistral,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_5_text,
    qwen3_moe,
    qwen3_next,
    seed_oss,
)
from rlcore.families.arch import Arch, dense_arch, routed_experts, text_config
from rlcore.families.base import Family, Megatron, Router
from rlcore.families.vision import tower_params, tower_shape, vision_family, vision_problems

FAMILIES: dict[str, Family] = {m.FAMILY.model_type: m.FAMILY for m in (
    qwen2, qwen3, llama, qwen3_moe, qwen2_moe, mistral, gemma2, gemma3_text, deepseek_v3, glm4_moe, gpt_oss, seed_oss, qwen3_5_text,
    qwen3_next)}
# every tiny shape the CPU suite builds: its name -> (model_type, config kwargs)
TINY_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {name: (f.model_type, kwargs) for f in FAMILIES.values() for name, kwargs in f.tiny.items()}
# megatron-core's built-in Llama 3.1 RoPE scaling (GPTModel(rope_scaling=True)) has these fixed parameters.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# Layer kinds whose cache is keys and values per token: the native engine's KV pool holds them.
KV_LAYER_KINDS = ("full_attention", "sliding_attention")

__all__ = ["FAMILIES", "TINY_SHAPES", "Arch", "Family", "Megatron", "Router", "arch_of", "family_of", "family_problems", "is_moe",
           "num_experts", "rope_parameters", "megatron_rope"]


def family_of(config: dict[str, Any]) -> Family | None:
    """The family module of a config.json (its language model's, for a multimodal one); None: the generic path."""
    return FAMILIES.get(text_config(config).get("model_type"))


def arch_of(config: dict[str, Any], name: str) -> Arch:
    """The plan's architecture facts: exact from the family's module, else estimated as Llama's block; a
    vision-language model's tower counted beside its language model's."""
    arch = _language_arch(config, name)
    tower = tower_params(config)
    return dataclasses.replace(arch, tower=tower, vision=tower_shape(config)) if tower else arch


def _language_arch(config: dict[str, Any], name: str) -> Arch:
    family, model_type = family_of(config), text_config(config).get("model_type")
    vision = vision_family(config)
    if family is None and vision is not None:  # Qwen2.5-VL's language model is Qwen2.5's block, Qwen3-VL's Qwen3's
        family = FAMILIES[vision.text_family]
    if family is not None:
        try:
            return family.arch(config, name)
        except KeyError as missing:  # a hand-edited config.json: plan the rest; family_problems names what is wrong
            return dense_arch(config, name, estimated=f"estimated as a Llama-style block: config.json has no {missing}, which "
                                                      f"{model_type}'s counts need")
    return dense_arch(config, name, estimated=f"estimated as a Llama-style block: rlcore has no module for model_type={model_type!r}")


def is_moe(config: dict[str, Any]) -> bool:
    family = family_of(config)
    return family.is_moe if family is not None else bool(routed_experts(text_config(config)))


def num_experts(config: dict[str, Any]) -> int:
    """Routed experts per MoE layer (0 for a dense model)."""
    return routed_experts(text_config(config)) if is_moe(config) else 0


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
    partial = {"rotary_percent": float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))}  # GLM-4.5: half a head
    if kind == "default":
        return theta, partial
    if kind == "llama3" and all(params.get(k) == v for k, v in LLAMA3_ROPE.items()):
        return theta, {"rope_scaling": True, "rope_scaling_factor": params["factor"], **partial}
    raise ValueError(f"{config.get('model_type')} RoPE scaling {params} has no megatron-core equivalent; use strategy=fsdp2 for this model")


def _transformers_causal_lm(model_type: str) -> str | None:
    """The causal-LM class transformers maps `model_type` to, or None (read only for a model without a module:
    it imports torch)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def family_problems(config: dict[str, Any], strategy: str, rollout: str | None = None, tensor_parallel: int = 1) -> list[str]:
    """Why rlcore cannot train this architecture with `strategy` (fsdp / fsdp2 / megatron; over `tensor_parallel`
    megatron TP ranks) and roll it out with `rollout` (native / vllm; None: not asked); empty when it can. Each
    problem ends with what to do instead."""
    model_type = config.get("model_type")
    if "vision_config" in config:  # Qwen2.5-VL, Qwen3-VL: FSDP2 through HF's modules, vLLM or native rollout
        return vision_problems(config, strategy, rollout)
    c = text_config(config)
    model_type = c.get("model_type")
    family = FAMILIES.get(model_type)
    problems = []
    if family is None:
        if not _transformers_causal_lm(model_type) and "AutoModelForCausalLM" not in (config.get("auto_map") or {}):
            return [f"model_type={model_type!r} is not a causal LM transformers ships (nor one its config.json's auto_map "
                    "names): rlcore trains decoder-only causal LMs through transformers' own modules; upgrade transformers "
                    "or use a checkpoint of a family it has (docs/models.md)"]
        if strategy == "megatron":
            problems.append(f"model_type={model_type!r} has no megatron-core build in rlcore (it runs on the generic path); "
                            "use actor_rollout_ref.actor.strategy=fsdp2")
    elif strategy == "megatron":
        if family.megatron is None:
            problems.append(f"model_type={model_type!r} on megatron: {family.megatron_missing}; use strategy=fsdp2 for this model")
        elif family.megatron.latent_attention and tensor_parallel > 1 and c.get("num_attention_heads", 2 * tensor_parallel) < 2 * tensor_parallel:
            # rlcore.engine.megatron.attention tells the shared RoPE key from the queries by its one head
            problems.append(f"megatron.tensor_model_parallel_size={tensor_parallel}: {model_type}'s latent attention needs at least "
                            f"two of its {c['num_attention_heads']} heads per TP rank; use a smaller tensor_model_parallel_size")
        elif not family.megatron.latent_attention:  # MLA builds its own RoPE (rlcore.families.deepseek_v3)
            try:
                megatron_rope(c)
            except ValueError as err:
                problems.append(str(err))
    if rollout == "vllm" and family is not None and family.vllm_problem:
        problems.append(f"model_type={model_type!r} with actor_rollout_ref.rollout.name=vllm: {family.vllm_problem}; "
                        "use actor_rollout_ref.rollout.name=native")
    if rollout == "native":
        recurrent = sorted({k for k in c.get("layer_types") or () if k not in KV_LAYER_KINDS})
        if recurrent:
            problems.append(f"model_type={model_type!r} has {', '.join(recurrent)} layers, whose recurrent state the native "
                            "engine's KV pool cannot hold; use actor_rollout_ref.rollout.name=vllm")
    if family is not None and family.problems is not None:
        problems += family.problems(config, strategy)
    return problems

