"""The optimizer and its learning-rate schedule of every trained role (`<role>.optim.*`), cut the way verl cuts its
optim config (its FSDP and Megatron optim sections share these keys): the fields, then their rules.

This module imports neither torch nor ray.
"""

import dataclasses
import importlib.util
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (`*.optim.*`)."""

    optimizer: str = "AdamW"  # optimizer class name
    lr: float = 1e-6  # peak learning rate
    lr_warmup_steps: int = -1  # linear warmup steps; -1 = lr_warmup_steps_ratio x total_training_steps
    lr_warmup_steps_ratio: float = 0.0  # warmup as a fraction of total steps, in [0, 1]
    total_training_steps: int = -1  # schedule length; -1 = filled in by the trainer
    weight_decay: float = 0.01  # decoupled weight decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam betas
    clip_grad: float = 1.0  # max global grad norm
    lr_scheduler_type: str = "constant"  # after warmup: constant | cosine | linear | inverse_square_root
    min_lr_ratio: float = 0.0  # cosine and linear floor as a fraction of lr
    num_cycles: float = 0.5  # cosine cycles over the schedule (0.5 = one half-cosine decay)
    lr_decay_style: Optional[str] = None  # verl's Megatron name for lr_scheduler_type; set, it is the schedule
    warmup_style: Optional[str] = None  # verl's deprecated FSDP name for lr_scheduler_type; set, it is the schedule
    # The first update is the schedule's step 1 (torchtitan's count: no update runs at a warmup's lr_warmup_init, 0
    # by default); True counts it as step 0 as verl does (verl 0.9's default; its constant schedule always does)
    zero_indexed_step: bool = False
    optimizer_impl: str = "torch.optim"  # verl 0.9's optimizer module: rlcore's engines build torch.optim's AdamW
    min_lr: Optional[float] = None  # verl's Megatron floor of the decay, in lr units; set, it is min_lr_ratio x lr
    lr_warmup_init: float = 0.0  # verl's Megatron lr at the warmup's start (rlcore: on either engine)
    lr_decay_steps: Optional[int] = None  # verl's Megatron decay length in optimizer steps; None = the run's steps
    # extra optimizer arguments, as verl passes them: megatron-core OptimizerConfig fields (strategy=megatron, e.g.
    # optimizer_cpu_offload), torch.optim.AdamW keywords (FSDP2, e.g. eps, amsgrad); {} as in verl's Megatron tree, so
    # that its scripts' `+...override_optimizer_config.key=value` compose (a null would refuse them)
    override_optimizer_config: Dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- rules
# Rules for the optimizer and its learning-rate schedule (`<role>.optim.*`), cut the way verl cuts its optim config
# (its FSDP and Megatron optim sections share these keys). `get(key)` reads the composed config; each rule returns
# messages naming the key and what to use (fsdp_schema.role_engine_errors gathers them for every trained role).
#
# verl names the schedule after warmup `lr_scheduler_type` in its FSDP optim section and `lr_decay_style` in its
# Megatron one; rlcore reads one (`schedule_kind`) and refuses the two set to different schedules.
# `override_optimizer_config` passes extra arguments to the optimizer as verl does: megatron-core OptimizerConfig
# fields on Megatron, torch.optim.AdamW keywords on FSDP2.


LR_SCHEDULERS = ("constant", "cosine", "linear", "inverse_square_root")
# AdamW's arguments that rlcore's own optim keys set: an override of one would make two keys disagree silently
_ADAMW_FROM_KEYS = {"params": "the trained parameters", "lr": "optim.lr", "betas": "optim.betas", "weight_decay": "optim.weight_decay"}


# The three names verl has had for the schedule after warmup; the first one set decides
SCHEDULE_KEYS = ("lr_decay_style", "warmup_style", "lr_scheduler_type")


def schedule_kind(optim) -> str:
    """The schedule after warmup: `lr_decay_style` (verl's Megatron name) or `warmup_style` (its deprecated FSDP name)
    when set, else `lr_scheduler_type`."""
    return next(getattr(optim, key) for key in SCHEDULE_KEYS if getattr(optim, key, None) is not None)


def optim_errors(get, optim: str, strategy: str, device: str) -> list[str]:
    """`optim` is a trained role's optim section (e.g. actor_rollout_ref.actor.optim), trained with `strategy`."""
    o = get(optim)
    errors = []
    for key in SCHEDULE_KEYS:
        value = getattr(o, key)
        if value is not None and value not in LR_SCHEDULERS:
            errors.append(f"{optim}.{key}={value} is not one of {', '.join(LR_SCHEDULERS)}")
    kind = o.lr_scheduler_type
    for key in SCHEDULE_KEYS[:2]:  # an alias set beside a different lr_scheduler_type (constant is its default)
        alias = getattr(o, key)
        if alias is not None and kind not in ("constant", alias):
            errors.append(f"{optim}.{key}={alias} and {optim}.lr_scheduler_type={kind} name two schedules (verl's names for "
                          f"the same thing); set one of them")
    decay, style = o.lr_decay_style, o.warmup_style
    if decay is not None and style is not None and decay != style:
        errors.append(f"{optim}.lr_decay_style={decay} and {optim}.warmup_style={style} name two schedules; set one of them")
    overrides = dict(o.override_optimizer_config or {})
    if strategy == "megatron":
        return errors + _megatron_override_errors(optim, overrides, device)
    return errors + _adamw_override_errors(optim, overrides)


def _adamw_override_errors(optim: str, overrides: dict) -> list[str]:
    if not overrides:
        return []
    import torch

    known = set(inspect.signature(torch.optim.AdamW).parameters)
    errors = []
    for key in overrides:
        if key in _ADAMW_FROM_KEYS:
            errors.append(f"{optim}.override_optimizer_config.{key} is set by {_ADAMW_FROM_KEYS[key]}; use that key")
        elif key not in known:
            errors.append(f"{optim}.override_optimizer_config.{key} is not an argument of torch.optim.AdamW (the FSDP2 engine's "
                          f"optimizer); valid: {', '.join(sorted(known - set(_ADAMW_FROM_KEYS)))}")
    return errors


def _megatron_override_errors(optim: str, overrides: dict, device: str) -> list[str]:
    errors = []
    if overrides.get("optimizer_cpu_offload") and device != "cuda":
        errors.append(f"{optim}.override_optimizer_config.optimizer_cpu_offload=True needs CUDA (megatron-core's HybridDeviceOptimizer "
                      f"copies between CUDA streams); on trainer.device={device} the optimizer state is in host memory already: drop it")
    if not overrides or importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return errors  # planned where megatron-core is not installed: the engine checks the names when it builds
    from megatron.core.optimizer import OptimizerConfig

    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    return errors + [f"{optim}.override_optimizer_config.{key} is not a field of megatron-core's OptimizerConfig (see "
                     f"megatron/core/optimizer/optimizer_config.py: e.g. optimizer_cpu_offload, use_precision_aware_optimizer, "
                     f"main_grads_dtype)" for key in overrides if key not in fields]
