"""The rollout engine's memory plan on one device (rlcore.plan.memory's Estimator asks for it): the engine's own terms
(rlcore.rollout.sizing: the native engine's weight copy and KV pool, vLLM's gpu_memory_utilization budget) and what a
LoRA policy changes.

LoRA: without merging
(`actor_rollout_ref.model.lora.merge=False`, verl's default) the rollout holds the base once plus the adapters (the
native engine: one copy per held adapter; vLLM: its LoRA slots, `max_loras` x `max_lora_rank`, preallocated inside
gpu_memory_utilization), and each sync sends the adapters alone; merged, each sync sends merged weights (the native
engine the adapted ones after the first, vLLM every weight, its sleep having dropped them)."""

from __future__ import annotations

from rlcore.config.lora_schema import adapter_rank, unmerged_lora_rank
from rlcore.plan.arch import Arch
from rlcore.rollout.sizing import adapted_params, rollout_sizing
from rlcore.utils.sizes import DTYPE_BYTES as _BYTES

GIB = 2**30
ARR = "actor_rollout_ref"


def rollout_memory(est, arch: Arch, world: int) -> tuple[list, str, list, float]:
    """(items, note, levers, resident GiB while asleep) of the rollout engine on one device, a LoRA policy's adapters
    and sync counted. `est`: the memory plan's Estimator (its config reader, batch plan, capacity)."""
    r = est.c(f"{ARR}.rollout")
    sizing = rollout_sizing(r.name)
    items, note, levers, asleep = sizing.footprint(est, arch, world)
    items, note, asleep = with_adapters(est.c, sizing, arch, items, note, asleep, _BYTES[r.dtype], r.tensor_model_parallel_size)
    return items, note, levers, asleep


def with_adapters(get, sizing, arch: Arch, items: list, note: str, asleep: float, rollout_bytes: int, tp: int) -> tuple[list, str, float]:
    """The rollout's (items, note, resident GiB while asleep) with the policy's LoRA counted; unchanged without LoRA.
    `get`: a config key's value; `sizing`: the rollout engine's (rlcore.rollout.sizing); `rollout_bytes`: the
    rollout dtype's size."""
    rank = adapter_rank(get, f"{ARR}.model", f"{ARR}.actor.strategy")
    if not rank:
        return items, note, asleep
    if unmerged_lora_rank(get):
        adapters = arch.lora_params(rank) * 4 / GIB  # trained and sent in fp32
        items, note, asleep = sizing.unmerged_adapters(get, arch, rank, rollout_bytes, tp, items, note, asleep)
        return items, note + f"; each sync sends the adapters alone, {adapters * 1024:.1f} MiB (lora.merge=False)", asleep
    adapted = adapted_params(arch)  # merged in fp32; an engine whose sleep drops its weights gets the rest too, every sync
    every = sizing.merged_sync_sends_every_weight
    merged = (adapted * 4 + (arch.params() - adapted) * rollout_bytes * every) / GIB
    return items, note + f"; each sync sends {'every weight' if every else 'the adapted weights'} merged, {merged:.2f} GiB (lora.merge=True)", asleep
