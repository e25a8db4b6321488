"""Each pass's micro-batches on one rank, derived once in the run plan (rlcore.plan.run_plan) and handed to the
workers, which only lay them over their engine: verl's keys (`ppo_micro_batch_size_per_gpu`, the deprecated global
`ppo_micro_batch_size` over the role's data-parallel ranks, or `use_dynamic_bsz`'s token budgets) are read here and
nowhere else at run time, each over the data-parallel ranks of the group that runs the pass. The validator's batch
plan checks the same sizes (tests/plan/test_micro_plan.py holds the two to the same numbers on recipes of every kind).

This module imports neither torch nor ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlcore.config.distill_schema import teacher_entries
from rlcore.config.fsdp_schema import role_sp
from rlcore.config.reward_model_schema import uses_token_budgets
from rlcore.config.typed import dotted
from rlcore.plan.megatron_layout import Layout

ACTOR_UPDATE, ACTOR_LOG_PROB, REF_LOG_PROB = "actor_update", "actor_log_prob", "ref_log_prob"
CRITIC_VALUES, CRITIC_UPDATE, REWARD_MODEL = "critic_values", "critic_update", "reward_model"
TEACHER = "teacher:{name}"
GROUPS = {"actor": "actor_rollout", "critic": "critic", "reward_model": "reward_model", "teacher": "teacher"}  # role -> worker group


@dataclass(frozen=True)
class MicroBatch:
    """One pass's micro-batches on one rank: `rows` samples each, or (`rows` None) as many as `max_tokens` tokens
    per device hold; the engine multiplies the budget by its Ulysses size (the sp ranks sharing a micro-batch each
    hold 1/sp of its tokens, verl's rule)."""

    rows: Optional[int] = None
    max_tokens: Optional[int] = None


def micro_batches(cfg, pools: list[tuple[int, int]], where: dict[str, int]) -> dict[str, MicroBatch]:
    """Every pass of the run by name (the module's constants), over the placement's pools `where` each group runs."""
    arr, get = cfg.actor_rollout_ref, dotted(cfg)
    actor, rollout, ref = arr.actor, arr.rollout, arr.ref
    dp = {role: _data_parallel(cfg, get, role, pools[where[group]]) for role, group in GROUPS.items() if group in where}
    out = {ACTOR_UPDATE: _resolved(actor.use_dynamic_bsz, actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, dp["actor"],
                                   actor.ppo_max_token_len_per_gpu),
           ACTOR_LOG_PROB: _resolved(rollout.log_prob_use_dynamic_bsz, rollout.log_prob_micro_batch_size_per_gpu,
                                     rollout.log_prob_micro_batch_size, dp["actor"], rollout.log_prob_max_token_len_per_gpu)}
    # The reference's pass runs on the actor's processes (LoRA's base, or a frozen copy beside it) whenever the
    # controller asks for it (uses_reference); planned always, as the group can always be asked.
    out[REF_LOG_PROB] = _resolved(ref.log_prob_use_dynamic_bsz, ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size,
                                  dp["actor"], ref.log_prob_max_token_len_per_gpu)
    if "critic" in dp:
        c = cfg.critic
        out[CRITIC_UPDATE] = _resolved(c.use_dynamic_bsz, c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size, dp["critic"],
                                       c.ppo_max_token_len_per_gpu)
        out[CRITIC_VALUES] = _resolved(c.use_dynamic_bsz, c.forward_micro_batch_size_per_gpu, c.forward_micro_batch_size, dp["critic"],
                                       c.forward_max_token_len_per_gpu)
    if "reward_model" in dp:
        rm = cfg.reward_model
        out[REWARD_MODEL] = _resolved(uses_token_budgets(rm), rm.micro_batch_size_per_gpu, rm.micro_batch_size, dp["reward_model"],
                                      rm.forward_max_token_len_per_gpu)
    if "teacher" in dp:
        for name, teacher in teacher_entries(cfg).items():
            i = teacher.inference  # unset sizes are the reference's (teacher_entries), its deprecated global one too
            out[TEACHER.format(name=name)] = _resolved(i.log_prob_use_dynamic_bsz, i.log_prob_micro_batch_size_per_gpu,
                                                       ref.log_prob_micro_batch_size, dp["teacher"], i.log_prob_max_token_len_per_gpu)
    return out


def _data_parallel(cfg, get, role: str, pool: tuple[int, int]) -> int:
    """The data-parallel ranks of a role's engine on its pool, as the engine divides them: Megatron's by its
    model-parallel layout, FSDP2's by its Ulysses size (a teacher's forward runs without Ulysses)."""
    nodes, per_node = pool
    world = nodes * per_node
    if role == "teacher":
        return world
    section = cfg.actor_rollout_ref.actor if role == "actor" else getattr(cfg, role)
    if getattr(section, "strategy", None) == "megatron":
        return Layout.from_config(section.megatron).dp(world)
    return max(1, world // role_sp(get, role))


def _resolved(dynamic: bool, per_gpu: Optional[int], total: Optional[int], dp: int, budget: int) -> MicroBatch:
    """`{base}_per_gpu`, else verl's deprecated global `{base}` over the group's `dp` data-parallel ranks (neither:
    none, which the validator refuses before a worker asks)."""
    if dynamic:
        return MicroBatch(max_tokens=budget)
    return MicroBatch(rows=per_gpu if per_gpu is not None else None if total is None else max(1, total // dp))

