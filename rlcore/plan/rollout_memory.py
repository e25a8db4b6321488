"""The rollout engine's memory plan on one device (rlcore.plan.memory's Estimator asks for it): the native engine's
weight copy and KV pool, or vLLM's gpu_memory_utilization budget and what fits in it; and what a LoRA policy changes.

LoRA: without merging
(`actor_rollout_ref.model.lora.merge=False`, verl's default) the rollout holds the base once plus the adapters (the
native engine: one copy per held adapter; vLLM: its LoRA slots, `max_loras` x `max_lora_rank`, preallocated inside
gpu_memory_utilization), and each sync sends the adapters alone; merged, each sync sends merged weights (the native
engine the adapted ones after the first, vLLM every weight, its sleep having dropped them)."""

from __future__ import annotations

import math

from rlcore.config.lora_schema import adapter_rank, unmerged_lora_rank, vllm_max_lora_rank
from rlcore.plan.arch import Arch
from rlcore.plan.constants import DTYPE_BYTES as _BYTES

GIB = 2**30
ARR = "actor_rollout_ref"


def rollout_memory(est, arch: Arch, world: int) -> tuple[list, str, list, float]:
    """(items, note, levers, resident GiB while asleep) of the rollout engine on one device, a LoRA policy's adapters
    and sync counted. `est`: the memory plan's Estimator (its config reader, batch plan, capacity)."""
    items, note, levers, asleep = _engine(est, arch, world)
    r = est.c(f"{ARR}.rollout")
    items, note, asleep = with_adapters(est.c, arch, items, note, asleep, _BYTES[r.dtype], r.tensor_model_parallel_size)
    return items, note, levers, asleep


def _engine(est, arch: Arch, world: int) -> tuple[list, str, list, float]:
    c, r = est.c, est.c(f"{ARR}.rollout")
    rb, tp, max_len = _BYTES[r.dtype], r.tensor_model_parallel_size, r.max_model_len or est.max_len
    if r.name != "vllm":  # the native engine: its own weight copy, a KV pool of as many sequences as it sizes it for
        samples = est.plan.samples_per_rank_per_step if est.plan else 1
        weights = arch.params() * rb / GIB
        sequence = arch.kv_bytes(max_len, rb, windowed=False)  # its pool keeps every position of every layer
        budget = (c(f"{ARR}.rollout.engine_kwargs.native") or {}).get("kv_cache_memory_bytes")
        if budget is None and c("trainer.device") == "cuda":
            # the engine's: its share of the device less what its process holds then, here its weight copy (the
            # state other roles keep on the device would leave fewer slots: the plan counts them as more memory)
            budget = r.gpu_memory_utilization * est.capacity * GIB - weights * GIB
        slots = native_kv_slots(samples, r.max_num_seqs, budget, sequence)
        prefill = samples * c("data.max_prompt_length") * arch.vocab * (rb + 4) / GIB
        items = [("native engine weight copy", weights), (f"KV cache, {slots} sequences x {max_len} tokens", slots * sequence / GIB),
                 ("prefill logits", prefill)]
        if c("trainer.device") == "cuda" and not r.enforce_eager:  # the graphs' static logits buffer and their private pool's copy of the logits
            items.append(("decode CUDA graphs' logits", 2 * slots * arch.vocab * rb / GIB))
        return items, f"decodes {slots} of the rank's {samples} samples at once", [], weights
    budget = r.gpu_memory_utilization * est.capacity
    weights = arch.params() * rb / tp / GIB
    reserve = ((r.max_num_batched_tokens * (4 * arch.hidden + 2 * arch.mlp_width) * rb
                + r.max_num_seqs * arch.vocab * 4) / GIB + (0.0 if r.enforce_eager else 0.5))
    kv = budget - weights - reserve
    seqs = int(kv * GIB // arch.kv_bytes(max_len, rb, tp)) if kv > 0 else 0
    per_replica = est.plan.samples_per_step * tp // world if est.plan else 0
    note = (f"weights {weights:.1f} + reserve {reserve:.1f} + KV cache {max(kv, 0):.1f} GiB: {seqs} sequences of "
            f"{max_len} tokens at once per TP{tp} replica" + (f" (of {per_replica} per step)" if per_replica else ""))
    levers = []
    est.vllm_floor = (weights + reserve + arch.kv_bytes(max_len, rb, tp) / GIB) / est.capacity
    if seqs < 1:
        note = f"OOM: vLLM needs weights {weights:.1f} + reserve {reserve:.1f} GiB but gets {budget:.1f} GiB; " + note
        need = math.ceil(est.vllm_floor * 100) / 100
        # vLLM takes its fraction whatever TP is: more TP leaves more of it for the KV cache, not less peak
        if c("trainer.n_gpus_per_node") % (tp * 2) == 0:
            levers.append((f"{ARR}.rollout.tensor_model_parallel_size={tp * 2} (halves each device's weights)", weights / 2))
        if need < 1:
            levers.append((f"{ARR}.rollout.gpu_memory_utilization={need:.2f} (room for one full-length sequence)", 0.0))
    return [(f"vLLM: gpu_memory_utilization {r.gpu_memory_utilization} x {est.capacity:.0f} GiB", budget)], note, levers, 0.0


def native_kv_slots(samples: int, max_num_seqs: int, budget_bytes: float | None, sequence_bytes: float) -> int:
    """How many sequences the native engine's KV pool holds at once, as rlcore.rollout.native sizes it: a call's
    samples, at most max_num_seqs, at most what the KV budget holds (None: no budget, a CPU run without
    engine_kwargs.native.kv_cache_memory_bytes)."""
    fit = samples if budget_bytes is None else int(max(budget_bytes, 0) // sequence_bytes)
    return min(samples, max_num_seqs, fit)


def adapted_params(arch: Arch) -> int:
    """The parameters of the linears all-linear LoRA adapts (what a merged sync of the adapted weights sends)."""
    return sum(b.count * i * o for b in arch.blocks for i, o in b.linears)


def with_adapters(get, arch: Arch, items: list, note: str, asleep: float, rollout_bytes: int, tp: int) -> tuple[list, str, float]:
    """The rollout's (items, note, resident GiB while asleep) with the policy's LoRA counted; unchanged without LoRA.
    `get`: a config key's value; `rollout_bytes`: the rollout dtype's size."""
    rank = adapter_rank(get, f"{ARR}.model", f"{ARR}.actor.strategy")
    if not rank:
        return items, note, asleep
    vllm = get(f"{ARR}.rollout.name") == "vllm"
    if unmerged_lora_rank(get):
        adapters = arch.lora_params(rank) * 4 / GIB  # trained and sent in fp32
        if vllm:
            slots, max_rank = int((get(f"{ARR}.rollout.engine_kwargs.vllm") or {}).get("max_loras", 1)), vllm_max_lora_rank(rank) or rank
            held = slots * arch.lora_params(max_rank) * rollout_bytes / tp / GIB
            note += f"; LoRA slots {held:.2f} GiB of it ({slots} x max_lora_rank {max_rank})"
        else:
            held = arch.lora_params(rank) * rollout_bytes / GIB
            # merge_adapters: merged into the weights from a kept copy of the adapted base weights
            merge_in = bool((get(f"{ARR}.rollout.engine_kwargs.native") or {}).get("merge_adapters"))
            copy = adapted_params(arch) * rollout_bytes / GIB if merge_in else 0.0
            items = items + [(f"LoRA adapters over the base (rank {rank})", held)]
            items += [("adapted base weights' copy (merge_adapters)", copy)] if merge_in else []
            asleep += held + copy
        return items, note + f"; each sync sends the adapters alone, {adapters * 1024:.1f} MiB (lora.merge=False)", asleep
    adapted = adapted_params(arch)  # merged in fp32; vLLM gets the rest too, every sync
    merged = (adapted * 4 + (arch.params() - adapted) * rollout_bytes * vllm) / GIB
    return items, note + f"; each sync sends {'every weight' if vllm else 'the adapted weights'} merged, {merged:.2f} GiB (lora.merge=True)", asleep
