"""The hybrid engine's memory contract, in one place: what each phase of a step needs on the compute device.

The roles take turns on one device, so memory, not FLOPs, decides what fits. Per phase (verl's hybrid engine keeps
the same order):

    sync           actor parameters (gathered a bucket at a time) + rollout weights
    generate       rollout weights + KV cache: the actor's parameters left before the KV cache woke
    old_log_prob   parameters only
    ref            parameters only (the reference has nothing else)
    values         parameters only (critic; the reward model's scores likewise)
    update_*       parameters + gradients + optimizer state
    checkpoint     everything the checkpoint writes or reads

`enter` brings onto the device what the next phase needs, of the state the role's offload flags send away
(`param_offload`, `grad_offload`, `optimizer_offload`); `leave` sends the flagged state back to the host. State a
flag does not offload stays on the device throughout, which the memory plan (rlcore.plan.memory) counts as such.
After generating, the rollout sleeps (`free_cache_engine`): level 2 frees its KV cache and its weights, since the
next sync refills every weight; with LoRA, whose syncs send only the adapted weights, level 1 keeps them.
`ledger` reports what a phase holds, by category, from the engines' own account of where their state is.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from rlcore.engine.base import STATE_KINDS, TrainEngine
from rlcore.rollout.base import RolloutEngine
from rlcore.utils.memory import reset_phase_peak as reset_peak  # noqa: F401  (each phase opens its peak window)

ALL = frozenset(STATE_KINDS)
PARAMS = frozenset({"params"})
NEEDS: dict[str, frozenset[str]] = {
    "sync": PARAMS,
    "generate": frozenset(),
    "old_log_prob": PARAMS,
    "ref": PARAMS,
    "values": PARAMS,
    "reward_model": PARAMS,
    "update_actor": ALL,
    "update_critic": ALL,
    "checkpoint": ALL,
}
UPDATES = ("update_actor", "update_critic")  # the phases whose gradients exist while they run


def offloadable(engine: TrainEngine) -> frozenset[str]:
    """The state the role's offload flags send to the host between phases."""
    s = engine.spec
    return frozenset(kind for kind, flag in zip(STATE_KINDS, (s.param_offload, s.grad_offload, s.optimizer_offload)) if flag)


def enter(engine: TrainEngine, phase: str) -> None:
    """Brings back what `phase` needs, of what the flags let leave (nothing else comes back)."""
    kinds = NEEDS[phase] & offloadable(engine)
    if kinds:
        engine.onload(**{kind: kind in kinds for kind in STATE_KINDS})


def leave(engine: TrainEngine) -> None:
    """Sends the flagged state to the host (a no-op for what is already there)."""
    kinds = offloadable(engine)
    if kinds:
        engine.offload(**{kind: kind in kinds for kind in STATE_KINDS})


@contextmanager
def running(engine: TrainEngine, phase: str) -> Iterator[None]:
    enter(engine, phase)
    try:
        yield
    finally:
        leave(engine)


def engine_ledger(engine: TrainEngine, phase: str) -> dict[str, int]:
    """Bytes of this engine's state on the device during `phase`: the resident kinds, and gradients only while an
    update runs when the engine frees them at every step (FSDP2)."""
    sizes, held = engine.state_bytes(), set(engine.resident)
    if not engine.persistent_grads:
        held.discard("grads")
        if phase in UPDATES and "grads" in engine.resident:
            held.add("grads")
    return {kind: sizes[kind] if kind in held else 0 for kind in STATE_KINDS}


def ledger(phase: str, engines: dict[str, TrainEngine], rollout: RolloutEngine | None = None, transient_bytes: int = 0,
           device: torch.device | None = None) -> dict[str, float]:
    """`perf/memory/<phase>/<category>_gib`: what this rank holds on its compute device during `phase`, summed over
    its engines (actor and reference share a device), plus the rollout's weights and KV cache, the largest transient
    buffer (the weight sync's bucket), and on CUDA what the allocator holds as the ledger is read (`allocated_gib`:
    the categories without the transient one, and after an FSDP2 update without the gradients its optimizer step
    freed, plus the runtime's share that no category accounts for) and its peak since the phase began (`peak_gib`)."""
    held = dict.fromkeys(STATE_KINDS, 0)
    for engine in engines.values():
        for kind, nbytes in engine_ledger(engine, phase).items():
            held[kind] += nbytes
    if rollout is not None:
        held.update(rollout.memory_bytes())
    held["transient"] = transient_bytes
    out = {f"perf/memory/{phase}/{kind}_gib": nbytes / 2**30 for kind, nbytes in held.items()}
    if device is not None and device.type == "cuda":
        out[f"perf/memory/{phase}/allocated_gib"] = torch.cuda.memory_allocated(device) / 2**30
        out[f"perf/memory/{phase}/peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out[f"perf/memory/{phase}/device_used_gib"] = device_used_bytes(device) / 2**30
    return out


def device_used_bytes(device: torch.device) -> int:
    """What the whole device holds now (CUDA; 0 elsewhere). Unlike `torch.cuda.memory_allocated` it counts memory
    that bypasses PyTorch's caching allocator, as vLLM's sleep-mode pool does: the figure that shows whether a
    sleeping rollout engine really handed its weights and KV cache back."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free

