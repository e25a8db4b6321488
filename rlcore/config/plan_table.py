"""The batch plan as the table `rlcore-train` and `rlcore-plan` print (one 'batch plan: ...' line per size)."""

from __future__ import annotations

import math

from rlcore.config.validate import BatchPlan


def _critic_row(plan: BatchPlan) -> tuple[str, str]:
    if not plan.use_critic:
        return "off", "critic.enable, or null = on only for adv_estimator=gae"
    micro = plan.critic_micro_batches_per_mini_batch_per_rank
    return "on", ("token budget: critic.ppo_max_token_len_per_gpu" if micro is None
                  else f"{micro} micro-batches per mini-batch per rank")


def format_plan(plan: BatchPlan) -> str:
    """A short aligned table of the plan, one 'batch plan: ...' line per size."""
    n = plan.samples_per_step // plan.prompts_per_step
    epochs = plan.optimizer_steps_per_step // plan.mini_batches_per_step
    if plan.ppo_max_token_len_per_rank is not None:
        budget = plan.ppo_max_token_len_per_rank
        full = budget // plan.max_sequence_length  # 0 when the budget is below one sample: the validator says so
        micro = (f"<={math.ceil(plan.samples_per_mini_batch_per_rank / full)}" if full else "?",
                 f"token budget {budget} per micro-batch (actor.ppo_max_token_len_per_gpu) = {full} full-length samples")
    else:
        micro = (plan.micro_batches_per_mini_batch_per_rank, f"of {plan.ppo_micro_batch_size_per_rank} samples")
    rows = [
        ("world_size", plan.world_size, "trainer.nnodes x trainer.n_gpus_per_node"),
        ("dp_size", plan.dp_size, f"world_size / {plan.world_size // plan.dp_size} devices per model replica "
                                  "(ulysses_sequence_parallel_size, or megatron TP x PP x CP)"),
        ("prompts_per_step", plan.prompts_per_step, "data.train_batch_size"),
        ("samples_per_step", plan.samples_per_step, f"prompts x rollout.n {n}"),
        ("samples_per_rank_per_step", plan.samples_per_rank_per_step, "samples_per_step / dp_size"),
        ("mini_batches_per_step", plan.mini_batches_per_step, "train_batch_size / ppo_mini_batch_size"),
        ("samples_per_mini_batch", plan.samples_per_mini_batch, f"ppo_mini_batch_size x rollout.n {n}"),
        ("samples_per_mini_batch_per_rank", plan.samples_per_mini_batch_per_rank, "samples_per_mini_batch / dp_size"),
        ("micro_batches_per_mini_batch_per_rank", *micro),
        ("optimizer_steps_per_step", plan.optimizer_steps_per_step, f"mini_batches_per_step x ppo_epochs {epochs}"),
        ("critic", *_critic_row(plan)),
    ]
    width = max(len(name) for name, _, _ in rows)
    value_width = max(len(str(value)) for _, value, _ in rows)
    return "\n".join(f"batch plan: {name:<{width}}  {str(value):>{value_width}}  ({why})" for name, value, why in rows)
