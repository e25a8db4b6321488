"""Where a run's worker groups live: the device pools and the pool of each group, decided once for the controller
(rlcore.train builds a Ray placement per pool) and the memory plan (rlcore.plan.memory: which roles share a device).

This module imports neither torch nor ray.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlcore.config.validate import uses_critic


def placement(cfg: DictConfig) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """The device pools `[(nnodes, n_gpus_per_node)]` and the pool of each worker group. The critic shares the
    actor's devices unless critic.enable_resource_pool; the reward model shares the critic's (OpenRLHF's
    --colocate_critic_reward; the actor's when there is no critic) unless reward.reward_model.enable_resource_pool; the
    distillation teachers the actor's unless distillation.n_gpus_per_node gives them a pool. With
    actor_rollout_ref.hybrid_engine=False the rollout has a pool of its own (rollout.nnodes x rollout.n_gpus_per_node)."""
    pools, where = [(cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node)], {"actor_rollout": 0}
    if not cfg.actor_rollout_ref.hybrid_engine:  # split pools: the rollout on devices of its own (rollout.*)
        pools.append((cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node))
        where["rollout"] = 1
    for role, section, follows in (("critic", cfg.critic, "actor_rollout"), ("reward_model", cfg.reward.reward_model, "critic")):
        if not (uses_critic(cfg) if role == "critic" else section.enable):
            continue
        if section.enable_resource_pool:
            pools.append((section.nnodes, section.n_gpus_per_node))
            where[role] = len(pools) - 1
        else:
            where[role] = where.get(follows, 0)
    d = cfg.distillation
    if d.enabled:  # the teachers: a pool of their own when given one, else the actor's devices (as the reference)
        if d.n_gpus_per_node:
            pools.append((d.nnodes, d.n_gpus_per_node))
        where["teacher"] = len(pools) - 1 if d.n_gpus_per_node else 0
    return pools, where
