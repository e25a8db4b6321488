"""Rules for the keys every training role's engine reads (optimizer, FSDP sharding, gradient clipping, activation
offload, checkpoint contents), shared by the PPO trainer's validation and the SFT / reward-model trainers'.
`get(key)` reads the composed config; each rule returns messages naming the key and what to use.

This module imports neither torch nor ray."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from rlcore.config.validate_optim import optim_errors
from rlcore.utils.checkpoint_contents import CONTENTS as CHECKPOINT_CONTENTS, STATE

DEFAULT_GRAD_CLIP = 1.0  # <role>.grad_clip's and optim.clip_grad's default in the schemas

Get = Callable[[str], Any]


def role_engine_errors(get: Get, optim: Optional[str], fsdp: str, world: int, grad_clip: Optional[str] = None,
                       strategy: str = "fsdp2") -> List[str]:
    """One role's optimizer (None: frozen), fsdp_config section and ranks; `grad_clip`: the role's verl key that
    optim.clip_grad doubles (actor and critic); `strategy`: its backend."""
    errors = []
    if optim is not None:
        errors += optim_errors(get, optim, strategy, get("trainer.device"))
        name = get(f"{optim}.optimizer")
        if str(name).lower() != "adamw":
            errors.append(f"{optim}.optimizer={name}: rlcore trains with AdamW (torch's, decoupled weight decay, fp32 "
                          f"moments), verl's default; use {optim}.optimizer=AdamW")
        clip, role_clip = get(f"{optim}.clip_grad"), (get(grad_clip) if grad_clip else None)
        if grad_clip and DEFAULT_GRAD_CLIP not in (clip, role_clip) and clip != role_clip:
            errors.append(f"{grad_clip}={role_clip} and {optim}.clip_grad={clip} both set the gradient-norm clip (verl's "
                          f"actor key and its engine key): keep one, e.g. {grad_clip}={role_clip}")
    version = get(f"{fsdp}.strategy")  # verl's engine config names its FSDP version; the reward model's has none
    if version is not None and version not in ("fsdp", "fsdp2"):
        errors.append(f"{fsdp}.strategy={version} is not an FSDP version; use fsdp or fsdp2 (rlcore trains with FSDP2 either way)")
    size = get(f"{fsdp}.fsdp_size")
    if size != -1 and (size <= 0 or world % size):
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        errors.append(f"{fsdp}.fsdp_size={size} must be -1 (shard over all {world} ranks of the role) or divide them "
                      f"(hybrid sharding: groups of fsdp_size ranks shard, the groups replicate); use one of -1, "
                      f"{', '.join(map(str, divisors))}")
    return errors


def activation_offload_errors(get: Get, model: str, strategy: str) -> List[str]:
    """model.enable_activation_offload moves the inputs that gradient checkpointing keeps: FSDP2 only, checkpointing on."""
    if not get(f"{model}.enable_activation_offload"):
        return []
    if get(strategy) == "megatron":
        return [f"{model}.enable_activation_offload=True works with the FSDP2 engine; under megatron ({strategy}=megatron) "
                "use override_transformer_config.recompute_* to trade compute for activation memory"]
    if not get(f"{model}.enable_gradient_checkpointing"):
        return [f"{model}.enable_activation_offload=True moves the block inputs that gradient checkpointing keeps to host "
                f"memory; set {model}.enable_gradient_checkpointing=True too"]
    return []


def checkpoint_contents_errors(get: Get, checkpoint: str, resume_mode: str) -> List[str]:
    """save_contents / load_contents name verl's items, and a run that resumes its own checkpoints (resume_mode=auto)
    loads only what it saves."""
    errors = []
    saved, loaded = (list(get(f"{checkpoint}.{k}") or []) for k in ("save_contents", "load_contents"))
    for key, items in (("save_contents", saved), ("load_contents", loaded)):
        unknown = [item for item in items if item not in CHECKPOINT_CONTENTS]
        if unknown:
            errors.append(f"{checkpoint}.{key}: unknown item(s) {unknown}; choose from {list(CHECKPOINT_CONTENTS)}")
    never_saved = [item for item in loaded if item in STATE and item not in saved]
    if never_saved and get(resume_mode) == "auto":
        errors.append(f"{checkpoint}.load_contents asks for {never_saved}, which {checkpoint}.save_contents={saved} never "
                      f"writes, and {resume_mode}=auto resumes from this run's own checkpoints: add them to save_contents "
                      "or drop them from load_contents")
    return errors


def ppo_engine_errors(get: Get, critic: bool) -> List[str]:
    """The PPO trainer's roles: actor and reference (the hybrid pool), critic (when used) and reward model (when
    enabled), each on its own pool when it asks for one."""
    arr = "actor_rollout_ref"
    pool = lambda section: (get(f"{section}.nnodes") * get(f"{section}.n_gpus_per_node")  # noqa: E731
                            if get(f"{section}.enable_resource_pool") else get("trainer.nnodes") * get("trainer.n_gpus_per_node"))
    world = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
    errors = role_engine_errors(get, f"{arr}.actor.optim", f"{arr}.actor.fsdp_config", world, f"{arr}.actor.grad_clip",
                                get(f"{arr}.actor.strategy"))
    errors += role_engine_errors(get, None, f"{arr}.ref.fsdp_config", world)
    if critic:
        errors += role_engine_errors(get, "critic.optim", "critic.model.fsdp_config", pool("critic"), "critic.grad_clip",
                                     get("critic.strategy"))
    if get("reward_model.enable"):
        errors += role_engine_errors(get, None, "reward_model.model.fsdp_config", pool("reward_model"))
    errors += activation_offload_errors(get, f"{arr}.model", f"{arr}.actor.strategy")
    return errors + checkpoint_contents_errors(get, f"{arr}.actor.checkpoint", "trainer.resume_mode")


def supervised_engine_errors(get: Get) -> List[str]:
    """The SFT and reward-model trainers: one trained model (`model`, `optim`) over all ranks."""
    return role_engine_errors(get, "optim", "model.fsdp_config", get("trainer.nnodes") * get("trainer.n_gpus_per_node"))
