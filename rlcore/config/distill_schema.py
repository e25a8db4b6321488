"""Config of on-policy distillation (`distillation.*`, verl's keys and meanings: its docs/algo/opd.md).

The student (the actor) samples as in GRPO; a teacher scores every finished sample token by token (the log-prob of
each sampled token and, for the top-k losses, its own top-k tokens), and the actor's loss pulls the student towards
the teacher on the student's own samples. One teacher, or one per data source (`teacher_key` routes each sample).

This module imports neither torch nor ray.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional


@dataclass
class TeacherInferenceConfig:
    """How a teacher scores samples (`distillation.teacher_models.<name>.inference.*`, verl's RolloutConfig subset).

    name=native: a forward of the teacher in rlcore's FSDP2 engine (sharded over the teacher's worker group: a
    teacher bigger than the student fits), log-probs from the same head the actor uses. name=vllm: one vLLM engine
    per teacher rank, scoring with prompt log-probs (rlcore.rollout.vllm_teacher)."""

    name: Optional[str] = None  # native | vllm; None = the rollout's engine (verl's default)
    dtype: Optional[str] = None  # the teacher's compute dtype; None = the rollout's
    # The distribution the teacher's log-probs are of: softmax(logits / temperature); None = the rollout's (verl's
    # default), so that student and teacher log-probs are of distributions at the same temperature.
    temperature: Optional[float] = None
    tensor_model_parallel_size: int = 1  # vLLM: GPUs per teacher replica (with data/pipeline sizes: its world size)
    data_parallel_size: int = 1  # vLLM: replicas inside one server (counted in the per-replica world size)
    pipeline_model_parallel_size: int = 1  # vLLM: pipeline stages (counted in the per-replica world size)
    gpu_memory_utilization: float = 0.5  # vLLM: share of the device its weights and cache may take
    max_model_len: Optional[int] = None  # vLLM: context; None = prompt + response + 1 (verl's requirement)
    max_num_seqs: int = 1024  # vLLM: sequences scored at once
    max_num_batched_tokens: int = 8192  # vLLM: tokens per scheduler step
    enforce_eager: bool = True  # vLLM: no CUDA graphs (scoring is one prefill per sample)
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)  # vLLM: extra engine arguments, under `vllm` (verl's layout)
    # rlcore additions (native): the forward's micro-batching; None = the reference's (actor_rollout_ref.ref.log_prob_*)
    log_prob_micro_batch_size_per_gpu: Optional[int] = None  # samples per forward per rank
    log_prob_use_dynamic_bsz: Optional[bool] = None  # token-budget micro-batches instead
    log_prob_max_token_len_per_gpu: Optional[int] = None  # the budget per micro-batch per rank
    param_offload: bool = False  # native: the teacher's shards leave the device between its passes


@dataclass
class TeacherModelConfig:
    """One teacher (`distillation.teacher_models.<name>.*`)."""

    key: Optional[str] = None  # the teacher_key value (e.g. a data_source) of the samples this teacher scores
    model_path: Optional[str] = None  # local HF model directory; must share the student's tokenizer
    num_replicas: int = 0  # verl's replicas of this teacher in the teacher pool (0 = fill the pool)
    trust_remote_code: bool = False  # rlcore addition: let the teacher's own modeling code run
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)


@dataclass
class DistillationLossConfig:
    """The distillation loss (`distillation.distillation_loss.*`): rlcore.algos.distill."""

    loss_mode: str = "k3"  # k1 | k2 | k3 | low_var_kl | abs | mse | forward_kl_topk | forward_kl_topk_tail
    topk: Optional[int] = 128  # teacher tokens per position for the top-k losses
    # True: loss = policy loss + distillation_loss_coef x distillation loss (task rewards drive the policy loss).
    # False: the distillation loss alone.
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0  # the distillation loss's weight beside task rewards
    loss_max_clamp: Optional[float] = 10.0  # per-token loss clamped to [-this, this]; None = not clamped
    log_prob_min_clamp: Optional[float] = -10.0  # top-k losses: log-probs floored here; None = not floored
    tail_mass_eps: float = 1e-7  # forward_kl_topk_tail: the student's tail mass is at least this (log guard)
    # True: the negative per-token loss is a reward for a PPO-clipped policy gradient (Thinking Machines' OPD;
    # recommended with k1). False: the loss is backpropagated directly (GKD; k3 or forward_kl_topk).
    use_policy_gradient: bool = True
    policy_loss_mode: str = "vanilla"  # the policy loss of the policy-gradient form (verl: vanilla only)
    clip_ratio: float = 0.2  # verl's key; the clip range is clip_ratio_low / clip_ratio_high
    clip_ratio_low: float = 0.2  # PPO clip of the policy-gradient form
    clip_ratio_high: float = 0.2  # the clip's upper side


@dataclass
class DistillationConfig:
    """On-policy distillation (`distillation.*`)."""

    enabled: bool = False  # on-policy distillation: teachers score the student's samples, the actor's loss uses them
    # The teacher pool: 0 = the teachers share the actor's devices (colocated, as the reference does).
    n_gpus_per_node: int = 0
    nnodes: int = 0  # machines of the teacher pool (with n_gpus_per_node; 0 = colocated)
    # Which column of a row routes it to a teacher (the teacher whose `key` equals the row's value). One teacher
    # scores every row whatever its key.
    teacher_key: str = "data_source"
    # Teachers by name, each a TeacherModelConfig (`+distillation.teacher_models.<name>.model_path=...` adds one, as
    # in verl's examples). Kept untyped here so that `+` can add entries; rlcore.config.validate_distill.teachers
    # reads each over TeacherModelConfig's defaults. `teacher_model` is verl's single-teacher entry; a teacher
    # without model_path is unused.
    teacher_models: Dict[str, Any] = field(default_factory=lambda: {"teacher_model": asdict(TeacherModelConfig())})
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
