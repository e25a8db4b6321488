"""A run's plan: every fact the controller needs that follows from the config (the step's sizes per role and rank,
which roles run, where each worker group lives, what each device is expected to hold), derived once when the run
starts (rlcore.train) and handed on: the controller places its groups from it, the step report reads its memory
plan. rlcore-plan prints the same plan without running anything.

This module imports neither torch nor ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlcore.config.validate import BatchPlan, diagnose
from rlcore.plan.memory import MemoryPlan, memory_plan
from rlcore.plan.micro_plan import MicroBatch, micro_batches
from rlcore.plan.placement import placement


@dataclass(frozen=True)
class RunPlan:
    batch: Optional[BatchPlan]  # None when the sizes are inconsistent (the errors say why)
    pools: list[tuple[int, int]]  # device pools [(nnodes, n_gpus_per_node)]
    where: dict[str, int]  # the pool of each worker group
    memory: MemoryPlan  # each role's per-device peak
    micro: dict[str, MicroBatch]  # each pass's micro-batches per rank, by pass (rlcore.plan.micro_plan); {} without a batch plan

    @property
    def planned_peaks(self) -> dict[str, float]:
        """GiB per device of each role the memory plan estimates, by its role name ("rollout", "actor update", ...)."""
        return {role.role: role.peak for role in self.memory.roles}


def plan_run(cfg, heads: Optional[tuple[int, int]] = None) -> tuple[RunPlan, list[str]]:
    """The plan of a composed PPO config and every problem found deriving it (the schema's rules, the model's
    limits). `heads`: the policy's (attention heads, KV heads) when known (rlcore.plan.heads.policy_heads)."""
    batch, errors = diagnose(cfg, heads)
    memory = memory_plan(cfg, batch)
    pools, where = placement(cfg)
    micro = micro_batches(cfg, pools, where) if batch is not None else {}
    return RunPlan(batch, pools, where, memory, micro), errors + memory.errors


def planned_micro_batches(cfg) -> dict[str, MicroBatch]:
    """The passes' micro-batches of a PPO config (typed or composed) as plan_run derives them for a valid one, for a
    worker built without the controller's plan (tests and tools, whose configs the validator may not have seen)."""
    return micro_batches(cfg, *placement(cfg))
