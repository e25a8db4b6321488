"""Attention heads against the ways a config splits them: rollout TP (the engine's rule), Megatron TP, Ulysses SP.

A split that does not divide the heads fails only when the engine builds (vLLM: "Total number of attention heads
(28) must be divisible by tensor parallel size (8)"), minutes into a GPU job; the architecture is known here, so the
doctor and the pre-launch check name it first. Imports neither torch nor ray.
"""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig, OmegaConf

from rlcore.config.fsdp_schema import role_sp, sp_key
from rlcore.plan.arch import Arch, resolve_arch
from rlcore.rollout.sizing import rollout_sizing

ARR = "actor_rollout_ref"


def _divisors_up_to(n: int, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if n % d == 0]


def _nearest(value: int, candidates: list[int]) -> list[int]:
    below = [v for v in candidates if v < value]
    above = [v for v in candidates if v > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _fix(key: str, values: list[int]) -> str:
    return "use " + " or ".join(f"{key}={v}" for v in values) if values else f"no value of {key} fits this model"


def head_errors(cfg: DictConfig, arch: Arch, model_key: str) -> list[str]:
    """The policy's heads vs every split of them the config asks for; each message names the key and a value that
    divides the heads (and the devices per node, where the split must stay inside a node)."""
    errors, per_node = [], int(OmegaConf.select(cfg, "trainer.n_gpus_per_node"))
    heads = f"{model_key}'s {arch.heads} attention heads / {arch.kv_heads} KV heads"

    engine = rollout_sizing(OmegaConf.select(cfg, f"{ARR}.rollout.name"))  # its own rule for splitting heads over TP
    key = f"{ARR}.rollout.tensor_model_parallel_size"
    tp = OmegaConf.select(cfg, key)
    if tp and tp >= 1 and not engine.splits_heads(arch.heads, arch.kv_heads, tp):
        ok = [v for v in _divisors_up_to(per_node, per_node) if engine.splits_heads(arch.heads, arch.kv_heads, v)]
        errors.append(f"{key}={tp} does not split {heads} ({engine.head_rule}); " + _fix(key, _nearest(tp, ok)))
    if OmegaConf.select(cfg, f"{ARR}.actor.strategy") == "megatron":
        for section in (f"{ARR}.actor.megatron", f"{ARR}.ref.megatron"):
            key = f"{section}.tensor_model_parallel_size"
            node = OmegaConf.select(cfg, section)
            if section.startswith(f"{ARR}.ref") and node is not None and OmegaConf.is_interpolation(node, "tensor_model_parallel_size"):
                continue  # the reference follows the actor's TP unless set: one report, against the key the user wrote
            tp = OmegaConf.select(cfg, key)
            if tp and tp >= 1 and (arch.heads % tp or arch.kv_heads % tp):
                ok = [v for v in _divisors_up_to(per_node, per_node) if arch.heads % v == 0 and arch.kv_heads % v == 0]
                errors.append(f"{key}={tp} does not split {heads} (megatron-core needs both divisible by TP); "
                              + _fix(key, _nearest(tp, ok)))
    else:
        get = lambda k: OmegaConf.select(cfg, k)  # noqa: E731
        sp, key = role_sp(get, "actor"), sp_key(get, "actor")
        if sp > 1 and arch.heads % sp:  # K/V heads are repeated when sp does not divide them
            ok = [v for v in _divisors_up_to(per_node, per_node) if arch.heads % v == 0]
            errors.append(f"{key}={sp} does not split {heads} (Ulysses gives each rank heads / sp whole query heads); "
                          + _fix(key, _nearest(sp, ok)))
    return errors


def policy_heads(cfg: DictConfig) -> Optional[tuple[int, int]]:
    """(attention heads, KV heads) of the policy when its shapes are known (config.json or the built-in table), for
    the validator's TP suggestions."""
    arch, _ = resolve_arch(OmegaConf.select(cfg, f"{ARR}.model.path"))
    return (arch.heads, arch.kv_heads) if arch else None
