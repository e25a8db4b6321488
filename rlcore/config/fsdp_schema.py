"""FSDP2 sharding, offload and precision of each role (`*.fsdp_config.*`, verl's engine/fsdp.yaml), and the frozen
reward model's (`reward_model.model.fsdp_config.*`). rlcore/engine/factory.py turns them into an EngineSpec.
Then the rules for what every trained role's engine reads (optimizer, sharding, gradient clip, activation offload,
checkpoint contents) and for Ulysses sequence parallelism, the FSDP2 engine's (`<role>.ulysses_sequence_parallel_size`
or its fsdp_config's).

This module imports neither torch nor ray."""

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from omegaconf import II

from rlcore.config.optim_schema import optim_errors
from rlcore.utils.checkpoint_contents import CONTENTS as CHECKPOINT_CONTENTS
from rlcore.utils.checkpoint_contents import STATE


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
    # verl 0.9's engine keys (its newer engine reads the role's settings from here):
    seed: int = 42  # verl's engine seed (rlcore seeds every worker from trainer.seed)
    full_determinism: bool = False  # deterministic torch kernels in this role's training engine
    entropy_from_logits_with_chunking: bool = False  # verl's chunked entropy (rlcore's head always works in chunks)
    entropy_from_logits_chunk_size: int = 2048  # verl's entropy chunk, in tokens
    entropy_checkpointing: bool = False  # recompute the entropy in backward (rlcore's head always does)
    use_torch_compile: bool = True  # verl's engine compile switch (the role's use_torch_compile decides in rlcore)
    pad_to_length: bool = False  # pad each packed micro-batch to a multiple of pad_to_length_bucket tokens
    pad_to_length_bucket: int = 1024  # that multiple
    forward_only: bool = False  # verl's inference-only engine (rlcore builds frozen roles without an optimizer itself)


# The fields verl's newer engine section (engine/fsdp.yaml) shares with an fsdp_config, nested ones dotted
ENGINE_FIELDS = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "fsdp_size",
                 "ulysses_sequence_parallel_size", "forward_prefetch", "model_dtype", "dtype", "strategy", "use_orig_params",
                 "seed", "full_determinism", "entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size",
                 "entropy_checkpointing", "use_torch_compile", "pad_to_length", "pad_to_length_bucket", "forward_only")


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


# ---------------------------------------------------------------------------------------------------- rules
# Rules for the keys every training role's engine reads (optimizer, FSDP sharding, gradient clipping, activation
# offload, checkpoint contents), shared by the PPO trainer's validation and the SFT / reward-model trainers'.
# `get(key)` reads the composed config; each rule returns messages naming the key and what to use.


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
        # megatron-core's "adam" (verl's Megatron default) is AdamW too: its weight decay is decoupled
        if str(name).lower() != "adamw" and not (strategy == "megatron" and name == "adam"):
            errors.append(f"{optim}.optimizer={name}: rlcore trains with AdamW (torch's, decoupled weight decay, fp32 "
                          f"moments), verl's default; use {optim}.optimizer=AdamW")
        impl = get(f"{optim}.optimizer_impl")
        if impl != "torch.optim":
            errors.append(f"{optim}.optimizer_impl={impl}: rlcore's engines build torch.optim's AdamW (fused on CUDA, foreach "
                          f"on the CPU, or megatron-core's distributed optimizer); use {optim}.optimizer_impl=torch.optim")
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
    m = get(model)
    if not m.enable_activation_offload:
        return []
    if get(strategy) == "megatron":
        return [f"{model}.enable_activation_offload=True works with the FSDP2 engine; under megatron ({strategy}=megatron) "
                "use override_transformer_config.recompute_* to trade compute for activation memory"]
    if not m.enable_gradient_checkpointing:
        return [f"{model}.enable_activation_offload=True moves the block inputs that gradient checkpointing keeps to host "
                f"memory; set {model}.enable_gradient_checkpointing=True too"]
    return []


def checkpoint_contents_errors(get: Get, checkpoint: str, resume_mode: str) -> List[str]:
    """save_contents / load_contents name verl's items, and a run that resumes its own checkpoints (resume_mode=auto)
    loads only what it saves."""
    ck = get(checkpoint)
    errors = []
    saved, loaded = (list(getattr(ck, k) or []) for k in ("save_contents", "load_contents"))
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
        errors += role_engine_errors(get, "critic.optim", "critic.fsdp", pool("critic"), "critic.grad_clip",
                                     get("critic.strategy"))
        errors += checkpoint_contents_errors(get, "critic.checkpoint", "trainer.resume_mode")
        if get("critic.model.enable_activation_offload"):
            errors.append("critic.model.enable_activation_offload=True: rlcore offloads the policy's checkpointed activations "
                          "only (actor_rollout_ref.model.enable_activation_offload); for the critic use "
                          "critic.fsdp.param_offload / optimizer_offload, or drop it")
    if get("reward.reward_model.enable"):
        errors += role_engine_errors(get, None, "reward_model.model.fsdp_config", pool("reward.reward_model"))
    errors += activation_offload_errors(get, f"{arr}.model", f"{arr}.actor.strategy")
    return errors + checkpoint_contents_errors(get, f"{arr}.actor.checkpoint", "trainer.resume_mode")


def supervised_engine_errors(get: Get) -> List[str]:
    """The SFT and reward-model trainers: one trained model (`model`, `optim`) over all ranks."""
    return role_engine_errors(get, "optim", "model.fsdp_config", get("trainer.nnodes") * get("trainer.n_gpus_per_node"))


# Rules for Ulysses sequence parallelism (`<role>.ulysses_sequence_parallel_size`, FSDP2 engine): a role's size,
# read from either of verl's two places, and what it needs. `c` is validate's checker (get / error).

ARR = "actor_rollout_ref"

# role -> (the role's own key, its fsdp_config's key: verl's newer engine config reads the size there, its older
# workers from the role's section; either sets it), the model section whose use_remove_padding it needs, strategy key
SP_KEYS = {
    "actor": (f"{ARR}.actor.ulysses_sequence_parallel_size", f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
              f"{ARR}.model", f"{ARR}.actor.strategy"),
    "ref": (f"{ARR}.ref.ulysses_sequence_parallel_size", f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size",
            f"{ARR}.model", f"{ARR}.ref.strategy"),
    "critic": ("critic.ulysses_sequence_parallel_size", "critic.fsdp.ulysses_sequence_parallel_size",
               "critic.model", "critic.strategy"),
    "reward_model": ("reward_model.ulysses_sequence_parallel_size", None, "reward_model.model", "reward_model.strategy"),
}


def sequence_parallel_size(*values) -> int:
    """The size from a role's keys (None: a key the section does not have): the one that is not 1 (validation
    refuses two different sizes)."""
    return max((int(v) for v in values if v is not None and v > 1), default=1)


def role_sp(get, role: str) -> int:
    """A role's size (`get`: a config getter by dotted key); the reference's is the actor's unless set (it shares
    the actor's processes and batches)."""
    role_key, fsdp_key, _, _ = SP_KEYS[role]
    own = sequence_parallel_size(get(role_key), get(fsdp_key) if fsdp_key else None)
    return role_sp(get, "actor") if role == "ref" and own == 1 else own


def sp_key(get, role: str) -> str:
    """The key that sets a role's size, for messages (the role's own key when neither does)."""
    sp = role_sp(get, role)
    return next((k for k in SP_KEYS[role][:2] if k and get(k) == sp), SP_KEYS[role][0])


def check_ulysses(c, role: str) -> None:
    """A role's sequence parallelism: one size, FSDP2 only, on packed sequences (verl's rule: sp > 1 needs
    use_remove_padding, since the slices are cut from the packed row)."""
    role_key, fsdp_key, model, strategy_key = SP_KEYS[role]
    values = {key: c.get(key) for key in (role_key, fsdp_key) if key}
    if role == "ref" and values[role_key] == c.get(SP_KEYS["actor"][0]):
        values.pop(role_key)  # the actor's value, interpolated (verl's default): the actor's checks cover it
    for key, value in values.items():
        if value is None or value < 1:
            c.error(f"{key}={value} must be >= 1; use {key}=1")
            return
    if len({v for v in values.values() if v != 1}) > 1 and fsdp_key in values and role_key in values:
        c.error(f"{role_key}={values[role_key]} and {fsdp_key}={values[fsdp_key]} disagree (verl reads either place); "
                f"set one of them, e.g. {role_key}={values[role_key]} {fsdp_key}=1")
        return
    sp = sequence_parallel_size(*values.values())
    if sp == 1:  # (a reference left at 1 follows the actor, whose checks cover it)
        return
    key = next(k for k, v in values.items() if v == sp)
    if c.get(strategy_key) == "megatron":
        c.error(f"{key}={sp} (Ulysses) runs on the FSDP2 engine; with {strategy_key}=megatron split sequences with "
                f"megatron.context_parallel_size (refused by rlcore's megatron engine) or use {strategy_key}=fsdp2")
    elif not c.get(model).use_remove_padding:
        c.error(f"{key}={sp} slices the packed sequence, which needs {model}.use_remove_padding=True (verl's rule too); "
                f"use {model}.use_remove_padding=True or {key}=1")
    if role == "ref" and sp != role_sp(c.get, "actor"):
        actor = SP_KEYS["actor"][0]
        c.error(f"{key}={sp} differs from the actor's {actor}={role_sp(c.get, 'actor')}: the reference runs in the actor's "
                f"processes on the actor's data layout; use {key}={role_sp(c.get, 'actor')}")
