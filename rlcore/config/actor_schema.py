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


@dataclass
class PolicyLossConfig:
    """Policy-gradient loss variant (`actor_rollout_ref.actor.policy_loss.*`)."""

    loss_mode: str = "vanilla"  # registered loss name (vanilla = PPO clip); rlcore/algos checks the name
    clip_cov_ratio: float = 0.0002  # clip_cov: fraction of tokens clipped
    clip_cov_lb: float = 1.0  # clip_cov: covariance lower bound
    clip_cov_ub: float = 5.0  # clip_cov: covariance upper bound
    kl_cov_ratio: float = 0.0002  # kl_cov: fraction of tokens with a KL penalty
    ppo_kl_coef: float = 0.1  # kl_cov: penalty coefficient


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
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
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
    use_prefix_grouper: bool = False  # each distinct prompt's forward once per micro-batch, shared by its responses
    # the old-log-prob pass also computes sum_v p(v)^2 per token: the optimal token baseline's score norm
    calculate_sum_pi_squared: bool = False
    sum_pi_squared_checkpointing: bool = False  # recompute that sum in backward to save memory
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # checkpoint contents
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimizer
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # sharding
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
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # sharding (param_offload is the usual change)
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
