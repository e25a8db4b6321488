"""Picks a training engine by the role's `strategy` key, and maps the role's verl-style config onto what the engine
needs: the only module that knows the backends (workers and trainer never branch on them)."""

from __future__ import annotations

import torch

from rlcore.config.fsdp_schema import DEFAULT_GRAD_CLIP, compute_dtype, sequence_parallel_size
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.config.optim_schema import schedule_kind
from rlcore.config.typed import plain
from rlcore.engine.base import EngineSpec, FSDPSpec, TrainEngine
from rlcore.models.lora import LoraSpec


def build_engine(strategy: str, spec: EngineSpec, device: torch.device, key: str = "actor_rollout_ref.actor.strategy") -> TrainEngine:
    if strategy in ("fsdp", "fsdp2"):
        from rlcore.engine.fsdp2 import FSDP2Engine

        return FSDP2Engine(spec, device)
    if strategy == "megatron":
        from rlcore.engine.megatron import MegatronEngine

        return MegatronEngine(spec, device)
    raise ValueError(f"{key}={strategy!r} is not a training backend of rlcore; use fsdp2 (or fsdp) or megatron")


def engine_spec(strategy: str, model_cfg, role_cfg, optim_cfg, grad_clip: float, total_steps: int, kind: str = "causal_lm",
                model_path: str | None = None) -> EngineSpec:
    """Maps a role's verl-style config onto an EngineSpec: `model`, the role's section (`actor`, `ref`, `critic`)
    whose `fsdp_config` (`fsdp` for the critic, `model.fsdp_config` for the other roles) or `megatron` holds sharding, precision and
    offloads, and `optim` (None = frozen). `model_path`: where the weights are when the model section does not say
    (the reward model's: reward.reward_model.model_path)."""
    # the actor's and reference's in their section, the critic's in its `fsdp` (verl 0.9), the others' under their model
    fsdp_cfg = getattr(role_cfg, "fsdp_config", None) or getattr(role_cfg, "fsdp", None) or model_cfg.fsdp_config
    spec = EngineSpec(
        model_path=model_path or model_cfg.path,
        kind=kind,
        override_config=dict(plain(model_cfg.override_config)),
        # Only the policy's section has hf_config_path (verl's critic and reward model have none); the SFT and
        # reward-training trainers' model sections have neither key.
        hf_config_path=getattr(model_cfg, "hf_config_path", None),
        trust_remote_code=bool(getattr(model_cfg, "trust_remote_code", False)),
        trainable=optim_cfg is not None,
        # Only a trained model recomputes activations (a frozen reward model's section has no such key).
        gradient_checkpointing=optim_cfg is not None and model_cfg.enable_gradient_checkpointing,
        use_remove_padding=model_cfg.use_remove_padding,
        freeze_vision_tower=optim_cfg is not None and bool(getattr(role_cfg, "freeze_vision_tower", False)),  # the actor's key
    )
    if strategy == "megatron":
        megatron = role_cfg.megatron
        spec.megatron, spec.fsdp = megatron_section(megatron), None
        spec.use_remove_padding = model_cfg.use_remove_padding and megatron.use_remove_padding
        spec.param_dtype = megatron.dtype
        spec.param_offload, spec.grad_offload, spec.optimizer_offload = megatron.param_offload, megatron.grad_offload, megatron.optimizer_offload
    else:
        spec.param_dtype, spec.param_offload = compute_dtype(fsdp_cfg), fsdp_cfg.param_offload
        mixed = getattr(fsdp_cfg, "mixed_precision", None)
        spec.fsdp = FSDPSpec(
            reduce_dtype=mixed.reduce_dtype if mixed is not None else FSDPSpec.reduce_dtype,
            offload_policy=fsdp_cfg.offload_policy, reshard_after_forward=fsdp_cfg.reshard_after_forward,
            fsdp_size=fsdp_cfg.fsdp_size, forward_prefetch=fsdp_cfg.forward_prefetch, wrap_min_params=fsdp_cfg.wrap_policy.min_num_params,
            # Only the policy's model section has the key (verl's critic and reward model have none).
            activation_offload=spec.gradient_checkpointing and bool(getattr(model_cfg, "enable_activation_offload", False)),
            use_torch_compile=bool(getattr(role_cfg, "use_torch_compile", False)),  # the actor's and the reference's key
            prefix_grouper=bool(getattr(role_cfg, "use_prefix_grouper", False)),  # the actor's key
        )
        # Ulysses: the role's key or its fsdp_config's (verl reads either); validation refuses two sizes.
        spec.ulysses_sp = sequence_parallel_size(getattr(role_cfg, "ulysses_sequence_parallel_size", None),
                                                getattr(fsdp_cfg, "ulysses_sequence_parallel_size", None))
        if getattr(fsdp_cfg, "model_dtype", None) is not None:  # the reward model's section has no such key (its weights load as fp32)
            spec.model_dtype = fsdp_cfg.model_dtype
        if optim_cfg is not None:  # a frozen role has no optimizer to offload
            spec.optimizer_offload = fsdp_cfg.optimizer_offload
    if optim_cfg is not None:
        warmup = optim_cfg.lr_warmup_steps if optim_cfg.lr_warmup_steps >= 0 else int(optim_cfg.lr_warmup_steps_ratio * total_steps)
        spec.lr, spec.betas, spec.weight_decay = optim_cfg.lr, tuple(optim_cfg.betas), optim_cfg.weight_decay
        # verl's Megatron optim section gives the floor, the warmup's start and the decay's length in its own units
        spec.warmup_steps, spec.total_steps = warmup, optim_cfg.lr_decay_steps or total_steps
        spec.lr_scheduler_type, spec.num_cycles = schedule_kind(optim_cfg), optim_cfg.num_cycles
        spec.min_lr_ratio = optim_cfg.min_lr / optim_cfg.lr if optim_cfg.min_lr is not None else optim_cfg.min_lr_ratio
        spec.zero_indexed_step, spec.warmup_init_ratio = optim_cfg.zero_indexed_step, optim_cfg.lr_warmup_init / optim_cfg.lr
        overrides = optim_cfg.override_optimizer_config
        spec.optimizer_overrides = dict(plain(overrides) or {})
        if strategy == "megatron" and spec.optimizer_overrides.get("optimizer_cpu_offload"):
            # megatron-core's hybrid optimizer keeps its state on the host: the between-phase offload (verl's scripts
            # set both) has nothing of it to move, and moving it to the device would undo the hybrid split
            spec.optimizer_offload = False
        spec.grad_clip = effective_grad_clip(grad_clip, optim_cfg.clip_grad)
        spec.lora = lora_spec(model_cfg, strategy)  # a frozen role (the reference) is the base: LoRA runs disable the adapters
    else:
        spec.optimizer_offload = spec.grad_offload = False  # nothing to move
    return spec


def megatron_section(section) -> MegatronConfig:
    """A role's `megatron` section as the schema's dataclass (workers hold it so; the doctor's composed config has
    its DictConfig)."""
    return section if isinstance(section, MegatronConfig) else MegatronConfig(**plain(section))


def lora_spec(model_cfg, strategy: str) -> LoraSpec | None:
    """The adapters a trained model gets: verl's FSDP keys (lora_rank, ...) or, under Megatron, its model.lora section."""
    names = lambda value: value if isinstance(value, str) or value is None else tuple(value)  # noqa: E731
    if strategy == "megatron" and getattr(model_cfg, "lora", None) is not None and model_cfg.lora.rank > 0:
        m = model_cfg.lora
        return LoraSpec(m.rank, m.alpha, names(m.target_modules), None, names(m.exclude_modules) or None, m.lora_A_init_method)
    if model_cfg.lora_rank > 0:
        return LoraSpec(model_cfg.lora_rank, model_cfg.lora_alpha, names(model_cfg.target_modules), model_cfg.lora_adapter_path,
                        names(getattr(model_cfg, "exclude_modules", None)))
    return None


def effective_grad_clip(role_grad_clip: float, optim_clip_grad: float) -> float:
    """verl's actor and critic read `<role>.grad_clip`, its newer engine config `<role>.optim.clip_grad`: whichever
    the user moved from the shared default (1.0) is meant (validation refuses two different settings). The SFT and
    reward-model trainers, which have only optim.clip_grad, pass it as both."""
    return optim_clip_grad if role_grad_clip == DEFAULT_GRAD_CLIP else role_grad_clip
