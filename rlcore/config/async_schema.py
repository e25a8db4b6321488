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

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


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


@dataclass
class HybridRolloutConfig:
    """verl 0.9: lend the trainer's idle devices to the rollout (`trainer.v1.separate_async.hybrid_rollout.*`)."""

    enable_switch: bool = False  # switch the trainer's devices to generation while it waits for samples (refused)
    switch_threshold_ratio: float = 0.4  # share of train_batch_size sampleable before the devices come back
    adaptive_switch_threshold: bool = True  # adapt that share to the trainer's idle time
    switch_threshold_step_up: float = 0.05  # added after sustained idle
    switch_threshold_step_down: float = 0.03  # taken off after a calm period
    switch_threshold_release_steps: int = 2  # steps of idle or calm before a change
    switch_cost_window_size: int = 3  # switches averaged for their cost


@dataclass
class SeparateAsyncConfig:
    """verl 0.9's trainer_mode=separate_async (`trainer.v1.separate_async.*`): the rollout on devices of its own."""

    num_warmup_batches: int = 1  # generation batches queued before training starts
    parameter_sync_step: int = 4  # mini-batches per step, one weight sync per step (train_batch_size = this x mini)
    hybrid_rollout: HybridRolloutConfig = field(default_factory=HybridRolloutConfig)  # the trainer's devices lent out


@dataclass
class ColocateAsyncConfig:
    """verl 0.9's trainer_mode=colocate_async (`trainer.v1.colocate_async.*`)."""

    num_warmup_batches: int = 1  # prompt batches sent beyond the first step's own, so more is in flight than a step trains


@dataclass
class CustomSamplerConfig:
    """A replay-buffer sampler of the user's (`trainer.v1.sampler.custom_sampler.*`): refused."""

    path: Optional[str] = None  # Python file defining the sampler
    name: Optional[str] = None  # its class's name


@dataclass
class OffPolicySamplerConfig:
    """Which samples an asynchronous step trains on (`trainer.v1.sampler.*`, verl 0.9)."""

    max_off_policy_threshold: int = 8  # weight versions a sample may span, from the version it started under (> 0)
    # drop: a sample past the threshold is dropped and its prompt generated again; wait: the trainer waits for the
    # oldest samples and trains on them (nothing dropped)
    max_off_policy_strategy: str = "drop"
    sync_refill_failed_groups: bool = False  # verl's sync mode: generate again the groups whose samples all failed
    custom_sampler: CustomSamplerConfig = field(default_factory=CustomSamplerConfig)  # refused
    sampler_kwargs: Dict[str, Any] = field(default_factory=dict)  # the custom sampler's arguments


@dataclass
class TrainerV1Config:
    """verl 0.9's trainer modes (`trainer.v1.*`), on rlcore's one loop: sync is the hybrid engine's loop,
    separate_async its split pools (the rollout on actor_rollout_ref.rollout.nnodes x n_gpus_per_node devices),
    colocate_async the hybrid loop with samples carried across steps (rlcore.rollout.partial)."""

    trainer_mode: str = "sync"  # sync | separate_async | colocate_async
    sync: Dict[str, Any] = field(default_factory=dict)  # verl's sync trainer's options (none)
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)  # trainer_mode=colocate_async
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)  # trainer_mode=separate_async
    sampler: OffPolicySamplerConfig = field(default_factory=OffPolicySamplerConfig)  # the samples a step trains on


TRAINER_MODES = ("sync", "separate_async", "colocate_async")
OFF_POLICY_STRATEGIES = ("drop", "wait")


def separate_async_keys(cfg) -> dict[str, Any]:
    """The split-pool keys verl 0.9's trainer_mode=separate_async stands for: the rollout on its own devices
    (actor_rollout_ref.rollout.nnodes x n_gpus_per_node), a step of parameter_sync_step mini-batches and one weight
    sync after it, partial rollouts, and the rollout at most max_off_policy_threshold - 1 steps ahead (a sample then
    spans at most max_off_policy_threshold weight versions when it is not resumed across a sync; the drop strategy
    removes those that are: rlcore.trainer.split_pools)."""
    v1, rollout = cfg.trainer.v1, cfg.actor_rollout_ref.rollout
    pool = {"rollout.nnodes": rollout.nnodes, "rollout.n_gpus_per_node": rollout.n_gpus_per_node} if rollout.nnodes >= 1 else {}
    return {f"{ARR}.hybrid_engine": False, **pool,  # no pool given (verl's nnodes=0): check_trainer_mode names the keys
            "async_training.require_batches": v1.separate_async.parameter_sync_step,
            "async_training.trigger_parameter_sync_step": 1, "async_training.partial_rollout": True,
            "async_training.staleness_threshold": float(max(v1.sampler.max_off_policy_threshold, 1) - 1)}


def apply_trainer_mode(cfg) -> None:
    """Writes what verl 0.9's trainer_mode=separate_async stands for into the split-pool keys a run reads, where they
    are left at their defaults (a value of the user's that disagrees is reported by check_trainer_mode), as the config
    is composed: once, before anything reads them."""
    from omegaconf import OmegaConf

    if cfg.trainer.v1.trainer_mode != "separate_async":
        return
    defaults = OmegaConf.structured(OmegaConf.get_type(cfg))
    for key, value in separate_async_keys(cfg).items():
        if OmegaConf.select(cfg, key) == OmegaConf.select(defaults, key):
            OmegaConf.update(cfg, key, value, merge=False)


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
        # verl 0.9's separate_async states the same rule with its own key
        key = ("trainer.v1.separate_async.parameter_sync_step" if c.cfg.trainer.v1.trainer_mode == "separate_async"
               else "async_training.require_batches")
        c.error(f"data.train_batch_size={train}: with {ARR}.hybrid_engine=False a trainer step consumes {key}="
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


def check_trainer_mode(c) -> None:
    """verl 0.9's trainer.v1.*: its modes on rlcore's loop, what it cannot do refused with the reason."""
    v1 = c.cfg.trainer.v1
    c.choice("trainer.v1.trainer_mode", TRAINER_MODES)
    c.choice("trainer.v1.sampler.max_off_policy_strategy", OFF_POLICY_STRATEGIES)
    c.at_least("trainer.v1.sampler.max_off_policy_threshold", 1)
    for key in ("path", "name"):
        if getattr(v1.sampler.custom_sampler, key):
            c.error(f"trainer.v1.sampler.custom_sampler.{key}={getattr(v1.sampler.custom_sampler, key)}: a replay-buffer sampler "
                    "of your own is not supported by rlcore; its rollouter trains on whole generation batches in order "
                    "(trainer.v1.sampler.max_off_policy_* bound them)")
    if v1.trainer_mode == "colocate_async":
        check_colocate_async(c)
    if v1.trainer_mode != "separate_async":
        return
    if v1.separate_async.hybrid_rollout.enable_switch:
        c.error("trainer.v1.separate_async.hybrid_rollout.enable_switch=True (lending the trainer's idle devices to the "
                "rollout) is not supported by rlcore; drop it (the rollout keeps its own devices)")
    if c.cfg.actor_rollout_ref.rollout.nnodes < 1:
        c.error(f"trainer.v1.trainer_mode=separate_async runs the rollout on devices of its own: set {ARR}.rollout.nnodes "
                f"(>= 1) and {ARR}.rollout.n_gpus_per_node (verl asserts the same)")
    for key, value in separate_async_keys(c.cfg).items():
        if c.get(key) != value:  # apply_trainer_mode wrote every one left at its default: the user set this one
            c.error(f"{key}={c.get(key)} and trainer.v1.trainer_mode=separate_async disagree (verl 0.9's mode sets {key}={value}); "
                    f"keep one dialect: drop {key}, or the v1 keys")


def check_colocate_async(c) -> None:
    """verl 0.9's colocate_async on the hybrid engine (rlcore.rollout.partial): what it needs of the rollout."""
    rollout, why = c.cfg.actor_rollout_ref.rollout, "trainer.v1.trainer_mode=colocate_async"
    if c.cfg.actor_rollout_ref.hybrid_engine is False:
        c.error(f"{why} runs rollout and training on the same devices, but {ARR}.hybrid_engine=False gives the rollout "
                f"devices of its own; drop {ARR}.hybrid_engine=False, or use trainer.v1.trainer_mode=separate_async")
    if rollout.name != "native":
        c.error(f"{why} with {ARR}.rollout.name={rollout.name}: rlcore's {rollout.name} engine runs each generation call to its "
                f"end (LLM.generate has no step to stop at), so no sample could be carried to the next step; use "
                f"{ARR}.rollout.name=native, or trainer.v1.trainer_mode=sync")
    agents = [key for key in (f"{ARR}.rollout.multi_turn.enable", f"{ARR}.rollout.agent.agent_loop_config_path",
                              f"{ARR}.rollout.multi_turn.interaction_config_path") if c.get(key)]
    if agents or c.get(f"{ARR}.rollout.agent.default_agent_loop") == "tool_agent":
        c.error(f"{why} with multi-turn or agent rollouts ({', '.join(agents) or 'default_agent_loop=tool_agent'}) is not "
                f"supported yet: rlcore carries single-turn samples across steps; use trainer.v1.trainer_mode=sync")
    if c.cfg.actor_rollout_ref.actor.router_replay.mode == "R3":
        c.error(f"{why} with {ARR}.actor.router_replay.mode=R3: a sample carried on under new weights has no single "
                f"rollout's routes to replay; use router_replay.mode=R2 (the old-log-prob pass's routes) or disabled")
    if c.cfg.algorithm.filter_groups.enable:
        c.error(f"{why} with algorithm.filter_groups.enable=True is not supported yet: set algorithm.filter_groups.enable=False, "
                f"or trainer.v1.trainer_mode=sync")
    sampler, warmup = c.cfg.trainer.v1.sampler, c.cfg.trainer.v1.colocate_async.num_warmup_batches
    if sampler.max_off_policy_strategy == "wait" and warmup + 1 > sampler.max_off_policy_threshold:
        c.error(f"trainer.v1.colocate_async.num_warmup_batches={warmup} with max_off_policy_strategy=wait and "
                f"max_off_policy_threshold={sampler.max_off_policy_threshold}: {warmup + 1} batches in flight, one trained per "
                f"step, keep the last {warmup + 1} steps' prompts waiting, past the bound that wait must keep (verl asserts "
                f"it when it samples); use num_warmup_batches <= {sampler.max_off_policy_threshold - 1}, or strategy drop")
    ranks, batch = c.cfg.trainer.nnodes * c.cfg.trainer.n_gpus_per_node, c.cfg.data.train_batch_size
    if isinstance(batch, int) and batch % ranks:
        c.error(f"data.train_batch_size={batch} with {why}: each of the {ranks} ranks (trainer.nnodes x n_gpus_per_node) "
                f"returns an equal share of the step's prompt groups, the first of its own to finish; use a multiple of {ranks}")


def async_warnings(get) -> list[str]:
    """What a verl user's split-pool keys ask for that rlcore does differently (printed, not refused)."""
    if not split_pools(get) or not get("async_training.partial_rollout") or get("actor_rollout_ref.rollout.name") != "vllm":
        return []
    gen = get("data.gen_batch_size")
    return [f"WARNING rlcore: async_training.partial_rollout=True with rollout.name=vllm: rlcore's vLLM engine runs each "
            f"generation call to its end (LLM.generate has no step to pause at), so a weight sync waits for the batch in "
            f"flight (data.gen_batch_size={gen} prompts) instead of interrupting it; the native engine (rollout.name=native) "
            f"parks and resumes. Set async_training.partial_rollout=False to silence this, or a smaller data.gen_batch_size to wait less"]
