"""A run's plan: every fact the controller needs that follows from the config (the step's sizes per role and rank,
which roles run, where each worker group lives, what each device is expected to hold), derived once when the run
starts (rlcore.train) and handed on: the controller places its groups from it, the step report reads its memory
plan. rlcore-plan prints the same plan without running anything.

This module imports neither torch nor ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlcore.config.async_schema import always_fresh, split_pools
from rlcore.config.typed import dotted
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
    on_policy: bool = False  # each update exactly on-policy: the old-log-prob pass is skipped (on_policy)

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
    return RunPlan(batch, pools, where, memory, micro, on_policy(cfg)), errors + memory.errors


def on_policy(cfg) -> bool:
    """Whether each step's update is exactly on-policy: the rollout sampled with the weights the actor is about to
    update (with split pools, only when every sample is fresh: staleness 0, a sync every step, no partial rollouts),
    updated once on the whole batch (one mini-batch, one epoch), and nothing needs the old log-probs before the
    update (a KL penalty in the reward, rollout correction's weights, the optimal token baseline's sum pi^2), and no
    sample is carried across steps (colocate_async). The
    old-log-prob pass would then only recompute the update's own log-probs (ratio 1): the controller skips it."""
    actor, rc = cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction
    get = dotted(cfg)
    return (cfg.data.train_batch_size == actor.ppo_mini_batch_size and actor.ppo_epochs == 1 and not cfg.algorithm.use_kl_in_reward
            and rc.rollout_is is None and rc.rollout_rs is None and not actor.calculate_sum_pi_squared
            and (not split_pools(get) or always_fresh(get)) and cfg.trainer.v1.trainer_mode != "colocate_async")


def planned_micro_batches(cfg) -> dict[str, MicroBatch]:
    """The passes' micro-batches of a PPO config (typed or composed) as plan_run derives them for a valid one, for a
    worker built without the controller's plan (tests and tools, whose configs the validator may not have seen)."""
    return micro_batches(cfg, *placement(cfg))
