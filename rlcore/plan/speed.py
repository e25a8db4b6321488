"""Time the device has memory to buy: settings that spend memory the plan says is spare and save time, each found by
planning the run again with it changed (rlcore-plan prints them under "speed:").

Each stands on a measurement of the 0.5B GRPO shape on an H200 (docs/benchmarks.md): without gradient checkpointing
and with one micro-batch per mini-batch the update took 21% less time and the log-prob passes 30-37% less; and the
native engine captures its decode graphs again after every sleep (rollout/graphs.py), which an engine that stays
awake does once. Only a run that fits now is given hints, each of which must still fit with every phase's verdict
"fits" (not "tight"): a hint never trades a working run for a faster one that might not run.
"""

from __future__ import annotations

import copy

from omegaconf import OmegaConf

from rlcore.config.validate import diagnose
from rlcore.plan.memory import memory_plan
from rlcore.plan.placement import placement

ARR = "actor_rollout_ref"


def speed_hints(cfg, batch, memory) -> list[str]:
    """Hints for a composed PPO config on CUDA with its BatchPlan and MemoryPlan; [] elsewhere (CPU runs are not
    bound by these)."""
    if cfg.trainer.device != "cuda" or batch is None or not memory.ok or not memory.roles:  # no roles: no model to plan
        return []
    arr, hints = cfg.actor_rollout_ref, []
    key = f"{ARR}.model.enable_gradient_checkpointing"
    if arr.model.enable_gradient_checkpointing and (room := _fits(cfg, {key: False})):
        hints.append(f"{key}=False: the run fits without recomputing each layer's forward in the backward ({room})")
    whole = batch.samples_per_mini_batch_per_rank * batch.max_sequence_length  # a mini-batch at its longest, on one rank
    key = f"{ARR}.actor.ppo_max_token_len_per_gpu"
    if (arr.actor.use_dynamic_bsz and arr.actor.strategy in ("fsdp", "fsdp2") and arr.actor.ulysses_sequence_parallel_size == 1
            and arr.actor.ppo_max_token_len_per_gpu < whole and (room := _fits(cfg, {key: whole}))):
        hints.append(f"{key}={whole}: each mini-batch in one micro-batch, fewer and larger kernels in the update and, through "
                     f"the log-prob budgets that default to it, the log-prob passes ({room})")
    key = f"{ARR}.rollout.free_cache_engine"
    if (arr.rollout.free_cache_engine and arr.rollout.name == "native" and not arr.rollout.enforce_eager
            and "rollout" not in placement(cfg)[1] and (room := _fits(cfg, {key: False}))):
        hints.append(f"{key}=False: the rollout engine stays awake beside training, so it captures its decode graphs once, "
                     f"not after every wake-up (rollout/graph_capture_s: their seconds a step) ({room})")
    return hints


def _fits(cfg, changes: dict) -> str | None:
    """The fullest phase of the run planned with `changes`, when every phase fits with room; else None."""
    changed = copy.deepcopy(cfg)
    for key, value in changes.items():
        OmegaConf.update(changed, key, value, merge=False)
    batch, errors = diagnose(changed)
    memory = memory_plan(changed, batch)
    if errors or not memory.ok or not memory.roles or any(role.verdict != "fits" for role in memory.roles):
        return None
    fullest = max(memory.roles, key=lambda role: role.peak / role.capacity)
    return f"then {fullest.role} plans {fullest.peak:.1f} of {fullest.capacity:.0f} GiB"
