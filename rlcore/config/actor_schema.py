"""The trained policy and its frozen reference (`actor_rollout_ref.actor.*`, `actor_rollout_ref.ref.*`): the PPO
update, its losses, checkpoint contents; the fields, then the prefix grouper's rules.

This module imports neither torch nor ray.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import II

from rlcore.config.fsdp_schema import FSDPConfig, role_sp
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.config.moe_schema import RouterReplayConfig
from rlcore.config.optim_schema import OptimConfig
from rlcore.config.profiler_schema import ProfilerConfig


@dataclass
class CheckpointConfig:
    """What a checkpoint holds (`actor_rollout_ref.actor.checkpoint.*`)."""

    save_contents: List[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])  # + "hf_model"
    load_contents: List[str] = II(".save_contents")  # what to restore; default = save_contents
    async_save: bool = False  # verl 0.9: write the checkpoint in the background (rlcore writes it before the next step)
    strict: bool = True  # verl 0.9: a checkpoint must hold every parameter to load (rlcore's always must)


def role_fsdp_config(role: str, **fields) -> FSDPConfig:
    """A role's fsdp_config whose entropy and padding keys follow the role's own, as verl 0.9's do."""
    follows = {key: II(f"oc.select:actor_rollout_ref.{role}.{key},{default}") for key, default in (
        ("entropy_checkpointing", "False"), ("entropy_from_logits_with_chunking", "False"),
        ("entropy_from_logits_chunk_size", "2048"), ("pad_to_length", "False"))}
    return FSDPConfig(**follows, **fields)


@dataclass
class PolicyLossConfig:
    """Policy-gradient loss variant (`actor_rollout_ref.actor.policy_loss.*`)."""

    loss_mode: str = "vanilla"  # registered loss name (vanilla = PPO clip); rlcore/algos checks the name
    clip_cov_ratio: float = 0.0002  # clip_cov: fraction of tokens clipped
    clip_cov_lb: float = 1.0  # clip_cov: covariance lower bound
    clip_cov_ub: float = 5.0  # clip_cov: covariance upper bound
    kl_cov_ratio: float = 0.0002  # kl_cov: fraction of tokens with a KL penalty
    ppo_kl_coef: float = 0.1  # kl_cov: penalty coefficient
    dro_beta: Optional[float] = None  # dro: weight of the quadratic log-ratio penalty; required (> 0) with loss_mode=dro
    # SAPO's temperatures where verl 0.9's SAPO scripts add them (`+...policy_loss.tau_pos`; verl itself reads the
    # actor's tau_pos / tau_neg): set, they win over the actor's; None = the actor's
    tau_pos: Optional[float] = None
    tau_neg: Optional[float] = None  # SAPO: as tau_pos, for the tokens with a non-positive advantage


@dataclass
class ActorConfig:
    """The trained policy: PPO update, losses, optimizer and sharding (`actor_rollout_ref.actor.*`)."""

    strategy: str = "fsdp"  # fsdp | fsdp2 (both run FSDP2 in rlcore) | megatron (megatron-core TP/PP)
    ppo_mini_batch_size: int = 256  # PROMPTS per optimizer step; samples = this x rollout.n
    ppo_micro_batch_size: Optional[int] = None  # deprecated: SAMPLES per micro-batch over all ranks
    ppo_micro_batch_size_per_gpu: Optional[int] = None  # SAMPLES per forward/backward per rank
    use_dynamic_bsz: bool = False  # form micro-batches by token budget instead of sample count
    ppo_max_token_len_per_gpu: int = 16384  # token budget per micro-batch per rank (use_dynamic_bsz)
    ppo_epochs: int = 1  # passes over each step's samples
    shuffle: bool = False  # shuffle samples between mini-batches
    clip_ratio: float = 0.2  # PPO clip epsilon: clip_ratio_low and clip_ratio_high unless they are set
    # rlcore: these follow clip_ratio (verl's YAML gives them their own 0.2, so clip_ratio alone changed nothing)
    clip_ratio_low: float = II(".clip_ratio")  # lower clip: ratio >= 1 - clip_ratio_low
    clip_ratio_high: float = II(".clip_ratio")  # upper clip: ratio <= 1 + clip_ratio_high (DAPO clip-higher)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages; must be > 1
    tau_pos: float = 1.0  # SAPO (loss_mode=sapo): the gate's temperature for tokens with a positive advantage
    tau_neg: float = 1.05  # SAPO: the gate's temperature for the others
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)  # loss variant
    loss_agg_mode: str = "token-mean"  # token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    entropy_coeff: float = 0.0  # entropy bonus weight (0 = off)
    use_kl_loss: bool = False  # add KL(actor || ref) to the loss (GRPO style); needs the ref model
    freeze_vision_tower: bool = False  # a vision-language policy's tower: no gradients, no optimizer state
    kl_loss_coef: float = 0.001  # weight of that KL term
    kl_loss_type: str = "low_var_kl"  # kl|k1 | abs | mse|k2 | low_var_kl|k3, each optionally with "+"
    grad_clip: float = 1.0  # max global grad norm (verl's actor key; optim.clip_grad is the engine's)
    ulysses_sequence_parallel_size: int = 1  # Ulysses: ranks sharing each sample's tokens (FSDP2, use_remove_padding)
    use_torch_compile: bool = True  # torch.compile the log-prob/entropy helpers
    entropy_from_logits_with_chunking: bool = False  # compute entropy in chunks to save memory
    entropy_checkpointing: bool = False  # recompute entropy in backward to save memory
    entropy_from_logits_chunk_size: int = 2048  # verl 0.9: tokens per entropy chunk
    # verl 0.9: the update's forward also computes the entropy for its metric when entropy_coeff is 0
    calculate_entropy: bool = False
    pad_to_length: bool = False  # verl 0.9: pad each packed micro-batch to fsdp_config.pad_to_length_bucket tokens
    data_loader_seed: int = 42  # verl 0.9: the seed of the mini-batch shuffle (actor.shuffle)
    # verl 0.9: seq-mean-token-sum-norm divides each sequence's token sum by this; None = the response length
    loss_scale_factor: Optional[int] = None
    rollout_n: int = II("oc.select:actor_rollout_ref.rollout.n,1")  # verl 0.9: follows rollout.n (which rlcore reads)
    use_remove_padding: bool = II("oc.select:actor_rollout_ref.model.use_remove_padding,false")  # follows the model's
    use_prefix_grouper: bool = False  # each distinct prompt's forward once per micro-batch, shared by its responses
    # the old-log-prob pass also computes sum_v p(v)^2 per token: the optimal token baseline's score norm
    calculate_sum_pi_squared: bool = False
    sum_pi_squared_checkpointing: bool = False  # recompute that sum in backward to save memory
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # checkpoint contents
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer
    fsdp_config: FSDPConfig = field(default_factory=lambda: role_fsdp_config("actor"))  # sharding
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # strategy=megatron layout
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)  # MoE: replay recorded routes
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # profiling on global_profiler.steps


@dataclass
class RefConfig:
    """The frozen reference policy for the KL term (`actor_rollout_ref.ref.*`); built only when a KL uses it."""

    strategy: str = II("actor_rollout_ref.actor.strategy")  # same choices as actor.strategy
    log_prob_micro_batch_size: Optional[int] = None  # deprecated: SAMPLES per micro-batch over all ranks
    log_prob_micro_batch_size_per_gpu: Optional[int] = None  # SAMPLES per forward per rank
    log_prob_use_dynamic_bsz: bool = II("oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false")  # token budgets
    # token budget per forward per rank (log_prob_use_dynamic_bsz); as the actor's ppo_max_token_len_per_gpu
    log_prob_max_token_len_per_gpu: int = II("oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384")
    # Ulysses: ranks sharing each sample's tokens; as the actor's
    ulysses_sequence_parallel_size: int = II("oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1")
    use_torch_compile: bool = II("oc.select:actor_rollout_ref.actor.use_torch_compile,true")  # as actor's
    entropy_from_logits_with_chunking: bool = False  # compute entropy in chunks to save memory
    entropy_checkpointing: bool = False  # recompute entropy in backward to save memory
    entropy_from_logits_chunk_size: int = 2048  # verl 0.9: tokens per entropy chunk
    pad_to_length: bool = II("oc.select:actor_rollout_ref.actor.pad_to_length,False")  # verl 0.9: as the actor's
    rollout_n: int = II("oc.select:actor_rollout_ref.rollout.n,1")  # verl 0.9: follows rollout.n (which rlcore reads)
    fsdp_config: FSDPConfig = field(default_factory=lambda: role_fsdp_config(  # sharding (param_offload is the usual change)
        "ref", forward_only=True, pad_to_length_bucket=II("oc.select:actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket,1024")))
    megatron: MegatronConfig = field(default_factory=lambda: MegatronConfig(  # strategy=megatron layout
        tensor_model_parallel_size=II("oc.select:actor_rollout_ref.actor.megatron.tensor_model_parallel_size,1"),
        pipeline_model_parallel_size=II("oc.select:actor_rollout_ref.actor.megatron.pipeline_model_parallel_size,1"),
        expert_model_parallel_size=II("oc.select:actor_rollout_ref.actor.megatron.expert_model_parallel_size,1"),
        expert_tensor_parallel_size=II("oc.select:actor_rollout_ref.actor.megatron.expert_tensor_parallel_size,null"),
        context_parallel_size=II("oc.select:actor_rollout_ref.actor.megatron.context_parallel_size,1")))
    router_replay: RouterReplayConfig = field(default_factory=lambda: RouterReplayConfig(  # replays the actor's routes
        mode=II("oc.select:actor_rollout_ref.actor.router_replay.mode,disabled")))
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # profiling on global_profiler.steps


# ---------------------------------------------------------------------------------------------------- rules
# Rules for the policy loss's own knobs (`actor_rollout_ref.actor.policy_loss.*`, rlcore/algos/policy_loss.py).

DRO_BETA = "actor_rollout_ref.actor.policy_loss.dro_beta"


def check_policy_loss(c) -> None:
    beta = c.cfg.actor_rollout_ref.actor.policy_loss.dro_beta
    if c.cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "dro":
        if beta is None or beta <= 0:  # verl raises at the first update; here before anything starts
            c.error(f"{DRO_BETA}={beta} must be > 0 with actor_rollout_ref.actor.policy_loss.loss_mode=dro (the weight of its "
                    f"quadratic log-ratio penalty, which keeps the policy near the sampling one); set e.g. {DRO_BETA}=0.1")
    elif beta is not None:
        c.error(f"{DRO_BETA}={beta} is read only by actor_rollout_ref.actor.policy_loss.loss_mode=dro; set loss_mode=dro, "
                f"or drop {DRO_BETA}")


# Rules for the prefix grouper (`actor_rollout_ref.actor.use_prefix_grouper`, rlcore/models/prefix_grouper.py).
# `c` is validate's checker (get / error).


KEY = "actor_rollout_ref.actor.use_prefix_grouper"


def check_prefix_grouper(c) -> None:
    if not c.get(KEY):
        return
    strategy = c.cfg.actor_rollout_ref.actor.strategy
    if strategy == "megatron":
        c.error(f"{KEY}=True packs prompts through the FSDP2 engine's attention; actor_rollout_ref.actor.strategy=megatron "
                "has no such path: use strategy=fsdp2, or use_prefix_grouper=False")
    sp = role_sp(c.get, "actor")
    if sp > 1:  # as verl: a grouped row cannot be split over Ulysses ranks by sequence
        c.error(f"{KEY}=True with Ulysses sequence parallelism (size {sp}): a group's responses all read its one prompt, "
                "which Ulysses would split over ranks; use ulysses_sequence_parallel_size=1, or use_prefix_grouper=False")
    if c.cfg.actor_rollout_ref.actor.router_replay.mode != "disabled":
        c.error(f"{KEY}=True with router replay: recorded routes are kept per row token, and grouped rows share their "
                "prompt's tokens; set actor_rollout_ref.actor.router_replay.mode=disabled, or use_prefix_grouper=False")
