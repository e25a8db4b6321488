"""Config of asynchronous training on split pools (verl's fully-async recipe keys): `async_training.*` and the
rollout pool `rollout.*`, used when `actor_rollout_ref.hybrid_engine=False`.

The rollout ranks and the training ranks then live on different devices. A rollouter streams scored samples into a
bounded queue while the trainer consumes them; the trainer's weights reach the rollout every
`trigger_parameter_sync_step` steps. How stale a sample may be is bounded by `staleness_threshold`: between two syncs
the rollout produces at most `(staleness_threshold + 1) x trigger_parameter_sync_step` steps' worth of samples.
verl's one-step-off-policy trainer is the case staleness_threshold=1, trigger_parameter_sync_step=1, and the
synchronous trainer the case staleness_threshold=0, trigger_parameter_sync_step=1, partial_rollout=False.

This module imports neither torch nor ray.
"""

from dataclasses import dataclass
from typing import Optional


@dataclass
class AsyncTrainingConfig:
    """How far the rollout may run ahead of the trainer (`async_training.*`, verl's fully-async keys)."""

    # Samples generated under old weights, as a fraction of what the trainer consumes between two syncs, beyond the
    # current window (0 = the rollout waits for every sync: synchronous)
    staleness_threshold: float = 0.1
    trigger_parameter_sync_step: int = 4  # trainer steps between weight syncs to the rollout pool
    require_batches: int = 1  # ppo mini-batches a trainer step consumes (data.train_batch_size = this x ppo_mini_batch_size)
    # A sync interrupts in-flight generations, which resume under the new weights (verl; rlcore's native engine). With
    # rollout.name=vllm the sync waits for the call in flight instead; see docs/split-pools.md
    partial_rollout: bool = True
    use_rollout_log_probs: bool = True  # old log-probs = the rollout's (bypass): the ratio is taken against the sampler
    compute_prox_log_prob: bool = False  # recompute old log-probs with the trainer's weights (decoupled PPO's proximal policy)


@dataclass
class RolloutPoolConfig:
    """The rollout's own devices with `actor_rollout_ref.hybrid_engine=False` (verl's top-level `rollout.*`)."""

    nnodes: int = 1  # machines
    n_gpus_per_node: int = 8  # rollout ranks per machine (also with device=cpu)
    # prompts to generate in all; sets the trainer's steps when trainer.total_training_steps is unset
    # (total_rollout_steps / data.train_batch_size)
    total_rollout_steps: Optional[int] = None
    # verl's copies of trainer keys, honoured when set:
    n: Optional[int] = None  # responses per prompt, when set (must equal actor_rollout_ref.rollout.n)
    total_epochs: Optional[int] = None  # when set, trainer.total_epochs
    # when set, validation every test_freq weight syncs (trainer.test_freq = this x trigger_parameter_sync_step)
    test_freq: Optional[int] = None


# ---------------------------------------------------------------------------------------------------- rules
# Rules for asynchronous training on split pools (`actor_rollout_ref.hybrid_engine=False`, `async_training.*`,
# `rollout.*`). `c` is validate's checker (get / error).


ARR = "actor_rollout_ref"


def split_pools(get) -> bool:
    """Whether the rollout runs on its own devices (`get`: a config getter by dotted key)."""
    return get(f"{ARR}.hybrid_engine") is False


def staleness_window(get) -> int:
    """Trainer steps' worth of samples the rollout may produce between two weight syncs (verl's bound:
    `(staleness_threshold + 1) x trigger_parameter_sync_step`, in steps instead of samples; at least the steps the
    trainer takes before the next sync, or the trainer would wait for samples the rollout may not make)."""
    trigger = get("async_training.trigger_parameter_sync_step")
    return max(trigger, int((get("async_training.staleness_threshold") + 1) * trigger))


def always_fresh(get) -> bool:
    """Whether every sample is generated with the weights the trainer updates from (staleness 0, a sync every step,
    no partial rollouts): the asynchronous loop is then the synchronous one, step for step."""
    return (get("async_training.staleness_threshold") == 0 and get("async_training.trigger_parameter_sync_step") == 1
            and not get("async_training.partial_rollout"))


def derive_async_sizes(cfg) -> None:
    """verl's fully-async command lines set `data.train_batch_size=0`: a trainer step then consumes
    `require_batches x ppo_mini_batch_size` prompts, written into the config here, once, as it is composed
    (rlcore.config.compose, rlcore.train.run; validate.diagnose only reads), so the loader, the batch plan and the
    memory plan see one number. The
    rollout's total prompts `rollout.total_rollout_steps` likewise set the trainer's steps when they are unset."""
    if cfg.actor_rollout_ref.hybrid_engine is not False:
        return
    a, mini = cfg.async_training, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if not cfg.data.train_batch_size and isinstance(mini, int) and isinstance(a.require_batches, int):
        cfg.data.train_batch_size = a.require_batches * mini
    if cfg.rollout.total_rollout_steps and not cfg.trainer.total_training_steps and cfg.data.train_batch_size:
        cfg.trainer.total_training_steps = max(1, cfg.rollout.total_rollout_steps // cfg.data.train_batch_size)
    if cfg.rollout.total_epochs is not None:
        cfg.trainer.total_epochs = cfg.rollout.total_epochs
    if cfg.rollout.test_freq is not None and cfg.rollout.test_freq > 0:
        cfg.trainer.test_freq = cfg.rollout.test_freq * a.trigger_parameter_sync_step


def check_async(c) -> None:
    if not split_pools(c.get):
        return
    for key in ("rollout.nnodes", "rollout.n_gpus_per_node", "async_training.trigger_parameter_sync_step", "async_training.require_batches"):
        c.at_least(key, 1)
    if c.cfg.async_training.staleness_threshold < 0:
        c.error(f"async_training.staleness_threshold={c.cfg.async_training.staleness_threshold} must be >= 0 "
                "(0: the rollout waits for every sync); use async_training.staleness_threshold=0.1")
    train, mini, need = c.cfg.data.train_batch_size, c.cfg.actor_rollout_ref.actor.ppo_mini_batch_size, c.cfg.async_training.require_batches
    if isinstance(mini, int) and isinstance(need, int) and train != need * mini:
        c.error(f"data.train_batch_size={train}: with {ARR}.hybrid_engine=False a trainer step consumes async_training.require_batches="
                f"{need} x {ARR}.actor.ppo_mini_batch_size={mini} = {need * mini} prompts; use data.train_batch_size={need * mini}")
    gen = c.cfg.data.gen_batch_size
    if not isinstance(gen, int) or gen < 1 or train % gen:
        c.error(f"data.gen_batch_size={gen} (prompts per rollout call) must divide data.train_batch_size={train} so a step takes "
                f"whole generation batches; use data.gen_batch_size={train} or a divisor of it")
    n, copy = c.cfg.actor_rollout_ref.rollout.n, c.cfg.rollout.n
    if copy is not None and copy != n:
        c.error(f"rollout.n={copy} differs from {ARR}.rollout.n={n}: rlcore samples {ARR}.rollout.n responses per prompt; "
                f"drop rollout.n or set both to the same value")
    if c.cfg.algorithm.filter_groups.enable:
        c.error("algorithm.filter_groups (dynamic sampling) with actor_rollout_ref.hybrid_engine=False is not supported yet: "
                "set algorithm.filter_groups.enable=False, or actor_rollout_ref.hybrid_engine=True")


def async_warnings(get) -> list[str]:
    """What a verl user's split-pool keys ask for that rlcore does differently (printed, not refused)."""
    if not split_pools(get) or not get("async_training.partial_rollout") or get("actor_rollout_ref.rollout.name") != "vllm":
        return []
    gen = get("data.gen_batch_size")
    return [f"WARNING rlcore: async_training.partial_rollout=True with rollout.name=vllm: rlcore's vLLM engine runs each "
            f"generation call to its end (LLM.generate has no step to pause at), so a weight sync waits for the batch in "
            f"flight (data.gen_batch_size={gen} prompts) instead of interrupting it; the native engine (rollout.name=native) "
            f"parks and resumes. Set async_training.partial_rollout=False to silence this, or a smaller data.gen_batch_size to wait less"]
