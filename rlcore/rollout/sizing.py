"""What each rollout engine takes on one device and asks of the model, in the terms the run's planner reads
(rlcore.plan: the memory plan, the heads check, rlcore-plan's rehearsal): the native engine's weight copy and a KV pool
of `native_kv_slots` sequences (the function the engine sizes its pool with), or vLLM's gpu_memory_utilization
budget and what fits inside it. Each engine's facts live beside the engine, so the planner has no branch of its own
on the engine's name (`rollout_sizing(name)`).

This module imports neither torch nor vLLM: rlcore-plan runs where neither engine could.
"""

from __future__ import annotations

import math
from typing import Optional

from rlcore.config.lora_schema import vllm_max_lora_rank
from rlcore.families.arch import Arch
from rlcore.utils.sizes import DTYPE_BYTES

GIB = 2**30
ARR = "actor_rollout_ref"


def native_kv_slots(samples: int, max_num_seqs: int, budget_bytes: float | None, sequence_bytes: float) -> int:
    """How many sequences the native engine's KV pool holds at once: a call's samples, at most max_num_seqs, at most
    what the KV budget holds (None: no budget, a CPU run without engine_kwargs.native.kv_cache_memory_bytes)."""
    fit = samples if budget_bytes is None else int(max(budget_bytes, 0) // sequence_bytes)
    return min(samples, max_num_seqs, fit)


class NativeSizing:
    """The embedded engine: a weight copy of its own, a KV pool that keeps every position of every layer."""

    engine = "native engine"
    teacher_runs_as = "FSDP2 forward"  # a native teacher: a frozen training engine, not this engine
    head_rule = ""  # no tensor parallelism: any heads split
    merged_sync_sends_every_weight = False  # it keeps its weights asleep: a merged sync sends the adapted ones

    def footprint(self, est, arch: Arch, world: int) -> tuple[list, str, list, float]:
        """(items, note, levers, resident GiB while asleep) on one device. `est`: the memory plan's Estimator (its
        config reader `c`, batch plan, capacity in GiB, max_len)."""
        c, r = est.c, est.c(f"{ARR}.rollout")
        rb, max_len = DTYPE_BYTES[r.dtype], r.max_model_len or est.max_len
        samples = est.plan.samples_per_rank_per_step if est.plan else 1
        weights = arch.params() * rb / GIB
        sequence = arch.kv_bytes(max_len, rb, windowed=False)
        budget = (c(f"{ARR}.rollout.engine_kwargs.native") or {}).get("kv_cache_memory_bytes")
        if budget is None and c("trainer.device") == "cuda":
            # the engine's: its share of the device less what its process holds then, here its weight copy (the
            # state other roles keep on the device would leave fewer slots: the plan counts them as more memory)
            budget = r.gpu_memory_utilization * est.capacity * GIB - weights * GIB
        slots = native_kv_slots(samples, r.max_num_seqs, budget, sequence)
        prefill = samples * c("data.max_prompt_length") * arch.vocab * (rb + 4) / GIB
        items = [("native engine weight copy", weights), (f"KV cache, {slots} sequences x {max_len} tokens", slots * sequence / GIB),
                 ("prefill logits", prefill)]
        if c("trainer.device") == "cuda" and not r.enforce_eager:  # the graphs' static logits buffer and their private pool's copy
            items.append(("decode CUDA graphs' logits", 2 * slots * arch.vocab * rb / GIB))
        return items, f"decodes {slots} of the rank's {samples} samples at once", [], weights

    def unmerged_adapters(self, get, arch: Arch, rank: int, rollout_bytes: int, tp: int, items: list, note: str,
                          asleep: float) -> tuple[list, str, float]:
        """LoRA without merging: a copy of the adapters over the base, and with merge_adapters a kept copy of the
        adapted base weights to merge them into."""
        held = arch.lora_params(rank) * rollout_bytes / GIB
        merge_in = bool((get(f"{ARR}.rollout.engine_kwargs.native") or {}).get("merge_adapters"))
        copy = adapted_params(arch) * rollout_bytes / GIB if merge_in else 0.0
        items = items + [(f"LoRA adapters over the base (rank {rank})", held)]
        items += [("adapted base weights' copy (merge_adapters)", copy)] if merge_in else []
        return items, note, asleep + held + copy

    def share_levers(self, est, peak: float, own: float, fit_share: float) -> list:
        return []  # its pool is sized by what it is given, not a share of the device

    def woken_for_sync(self, arch: Arch, rollout, items: list) -> tuple[str, float]:
        return items[0]  # its weight copy, kept while asleep

    def splits_heads(self, heads: int, kv_heads: int, tp: int) -> bool:
        return True

    def teacher_resident(self, key: str, inference, capacity: float) -> Optional[tuple[str, float]]:
        return None  # a native teacher is a training engine's forward (its phase is planned as the reference's)


class VLLMSizing:
    """vLLM: exactly gpu_memory_utilization x device memory; inside it weights / TP, a profiling and CUDA-graph
    reserve, and the KV cache that is left."""

    engine = "vLLM"
    teacher_runs_as = "vLLM"
    head_rule = "vLLM needs heads % TP == 0, and KV heads % TP == 0 or TP % KV heads == 0"
    merged_sync_sends_every_weight = True  # its level-2 sleep drops every weight

    def footprint(self, est, arch: Arch, world: int) -> tuple[list, str, list, float]:
        c, r = est.c, est.c(f"{ARR}.rollout")
        rb, tp, max_len = DTYPE_BYTES[r.dtype], r.tensor_model_parallel_size, r.max_model_len or est.max_len
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

    def unmerged_adapters(self, get, arch: Arch, rank: int, rollout_bytes: int, tp: int, items: list, note: str,
                          asleep: float) -> tuple[list, str, float]:
        """LoRA without merging: vLLM's slots (`max_loras` x `max_lora_rank`), preallocated inside its share."""
        slots, max_rank = int((get(f"{ARR}.rollout.engine_kwargs.vllm") or {}).get("max_loras", 1)), vllm_max_lora_rank(rank) or rank
        held = slots * arch.lora_params(max_rank) * rollout_bytes / tp / GIB
        return items, note + f"; LoRA slots {held:.2f} GiB of it ({slots} x max_lora_rank {max_rank})", asleep

    def share_levers(self, est, peak: float, own: float, fit_share: float) -> list:
        """A lower gpu_memory_utilization when the rollout's phase overflows `fit_share` of the device: it helps only
        while vLLM still holds its weights and one sequence's KV cache; below that the fix is to move what the other
        roles keep on the device. `own`: vLLM's share in GiB within the phase's `peak`."""
        capacity = est.capacity
        fit = capacity * fit_share - (peak - own)
        if peak > capacity * fit_share and fit / capacity >= getattr(est, "vllm_floor", 1.0):
            return [(f"{ARR}.rollout.gpu_memory_utilization={math.floor(100 * fit / capacity) / 100:.2f}", peak - capacity * fit_share)]
        return []

    def woken_for_sync(self, arch: Arch, rollout, items: list) -> tuple[str, float]:
        """Its weights alone, woken while the sync streams into them (the KV cache wakes after)."""
        tp = rollout.tensor_model_parallel_size
        return (f"vLLM weights woken for the sync ({rollout.dtype} / TP{tp})", arch.params() * DTYPE_BYTES[rollout.dtype] / tp / GIB)

    def splits_heads(self, heads: int, kv_heads: int, tp: int) -> bool:
        """vLLM splits query heads; KV heads split or are replicated."""
        return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)

    def teacher_resident(self, key: str, inference, capacity: float) -> Optional[tuple[str, float]]:
        """A vLLM teacher holds its share the whole run (it never sleeps for the actor)."""
        return f"vLLM, {key}.inference.gpu_memory_utilization={inference.gpu_memory_utilization}", inference.gpu_memory_utilization * capacity


SIZINGS = {"native": NativeSizing(), "hf": NativeSizing(), "vllm": VLLMSizing()}


def rollout_sizing(name: str):
    """The sizing of rollout engine `name` (`actor_rollout_ref.rollout.name`, a teacher's `inference.name`). A name
    the validator refuses (verl's sglang) is sized as the native engine: the doctor still shows the rest of the plan."""
    return SIZINGS.get(name, SIZINGS["native"])


def adapted_params(arch: Arch) -> int:
    """The parameters of the linears all-linear LoRA adapts (what a merged sync of the adapted weights sends)."""
    return sum(b.count * i * o for b in arch.blocks for i, o in b.linears)
