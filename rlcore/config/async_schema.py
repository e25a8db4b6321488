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
