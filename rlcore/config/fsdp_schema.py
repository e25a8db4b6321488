"""FSDP2 sharding, offload and precision of each role (`*.fsdp_config.*`, verl's engine/fsdp.yaml), and the frozen
reward model's (`reward_model.model.fsdp_config.*`). rlcore/engine/factory.py turns them into an EngineSpec."""

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import II


@dataclass
class WrapPolicyConfig:
    """Which modules get their own FSDP unit (`*.fsdp_config.wrap_policy.*`)."""

    min_num_params: int = 0  # wrap modules with at least this many parameters; 0 = per decoder layer


@dataclass
class MixedPrecisionConfig:
    """verl's FSDP mixed-precision dict (`*.fsdp_config.mixed_precision.*`, which verl's scripts add with `+`); when
    absent verl computes in fsdp_config.dtype and reduces gradients in fp32, as rlcore's defaults do."""

    param_dtype: Optional[str] = None  # compute dtype; null = fsdp_config.dtype
    reduce_dtype: str = "fp32"  # dtype gradients are reduce-scattered / all-reduced in across ranks
    buffer_dtype: str = "fp32"  # FSDP1's buffer cast; FSDP2 (verl's fsdp2 and rlcore) keeps buffers as loaded


@dataclass
class FSDPConfig:
    """FSDP2 sharding, offload and precision (`*.fsdp_config.*`)."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)  # FSDP unit granularity
    param_offload: bool = False  # keep parameters on CPU between uses
    optimizer_offload: bool = False  # keep optimizer state on CPU between steps
    offload_policy: bool = False  # FSDP2 CPUOffloadPolicy (params + grads + optimizer step on CPU)
    reshard_after_forward: bool = True  # free gathered params after forward (ZeRO-3); False = ZeRO-2
    fsdp_size: int = -1  # ranks per shard group; -1 = all data-parallel ranks (otherwise HSDP)
    ulysses_sequence_parallel_size: int = 1  # verl's newer place for the role's ulysses_sequence_parallel_size
    forward_prefetch: bool = False  # prefetch the next unit's all-gather during forward
    model_dtype: str = "fp32"  # dtype the weights are loaded and kept in: fp32 | bf16 | fp16 (long names ok)
    dtype: str = "bfloat16"  # mixed-precision compute dtype: bfloat16 | float16 | float32 (short names ok)
    strategy: str = "fsdp"  # verl's FSDP version for its newer engine: fsdp | fsdp2 (rlcore trains with FSDP2)
    use_orig_params: bool = False  # FSDP1's flat-parameter switch
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)  # verl's per-dtype form


# The fields verl's newer engine section (engine/fsdp.yaml) shares with an fsdp_config, nested ones dotted
ENGINE_FIELDS = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "fsdp_size",
                 "ulysses_sequence_parallel_size", "forward_prefetch", "model_dtype", "dtype", "strategy", "use_orig_params")


def following(section: str) -> FSDPConfig:
    """An fsdp_config each of whose fields follows `section`'s (verl's SFT trainer names them engine.*, its older one
    model.fsdp_config.*: either key sets the one value the engine reads)."""
    mixed = {name: II(f"{section}.mixed_precision.{name}") for name in ("param_dtype", "reduce_dtype", "buffer_dtype")}
    return FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=II(f"{section}.wrap_policy.min_num_params")),
                      mixed_precision=MixedPrecisionConfig(**mixed), **{name: II(f"{section}.{name}") for name in ENGINE_FIELDS})


@dataclass
class RewardModelFSDPConfig:
    """FSDP2 sharding of the frozen reward model (`reward_model.model.fsdp_config.*`)."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)  # FSDP unit granularity
    param_offload: bool = False  # keep parameters on CPU between uses
    reshard_after_forward: bool = True  # free gathered params after forward
    fsdp_size: int = -1  # ranks per shard group; -1 = all
    forward_prefetch: bool = False  # prefetch the next unit's all-gather during forward
    offload_policy: bool = False  # rlcore addition: FSDP2 CPUOffloadPolicy (params on CPU, streamed per block)
    dtype: str = "bfloat16"  # rlcore addition: compute dtype (float32 on CPU)


def compute_dtype(fsdp) -> str:
    """The dtype a role computes in: verl's mixed_precision.param_dtype when given (it wins over dtype, as in verl),
    else dtype. The one reading of the two keys: the engine and the memory plan both ask here."""
    mixed = getattr(fsdp, "mixed_precision", None)  # the reward model's section has none
    return mixed.param_dtype if mixed is not None and mixed.param_dtype else fsdp.dtype
