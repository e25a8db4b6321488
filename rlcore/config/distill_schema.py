"""Config of on-policy distillation (`distillation.*`, verl's keys and meanings: its docs/algo/opd.md).

The student (the actor) samples as in GRPO; a teacher scores every finished sample token by token (the log-prob of
each sampled token and, for the top-k losses, its own top-k tokens), and the actor's loss pulls the student towards
the teacher on the student's own samples. One teacher, or one per data source (`teacher_key` routes each sample).

This module imports neither torch nor ray.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Optional

from omegaconf import DictConfig, OmegaConf


@dataclass
class TeacherInferenceConfig:
    """How a teacher scores samples (`distillation.teacher_models.<name>.inference.*`, verl's RolloutConfig subset).

    name=native: a forward of the teacher in rlcore's FSDP2 engine (sharded over the teacher's worker group: a
    teacher bigger than the student fits), log-probs from the same head the actor uses. name=vllm: one vLLM engine
    per tensor_model_parallel_size consecutive teacher ranks, scoring with prompt log-probs
    (rlcore.rollout.vllm_teacher); each rank hands its engine its own rows, as the rollout's TP groups do."""

    name: Optional[str] = None  # native | vllm; None = the rollout's engine (verl's default)
    dtype: Optional[str] = None  # the teacher's compute dtype; None = the rollout's
    # The distribution the teacher's log-probs are of: softmax(logits / temperature); None = the rollout's (verl's
    # default), so that student and teacher log-probs are of distributions at the same temperature.
    temperature: Optional[float] = None
    tensor_model_parallel_size: int = 1  # vLLM: GPUs per teacher replica (with data/pipeline sizes: its world size)
    data_parallel_size: int = 1  # vLLM: replicas inside one server (counted in the per-replica world size)
    pipeline_model_parallel_size: int = 1  # vLLM: pipeline stages (counted in the per-replica world size)
    expert_parallel_size: int = 1  # vLLM: 1, or tensor_model_parallel_size (each rank holds whole experts)
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
    topk: Optional[int] = 32  # teacher tokens per position for the top-k losses
    # True: loss = policy loss + distillation_loss_coef x distillation loss (task rewards drive the policy loss).
    # False: the distillation loss alone.
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0  # the distillation loss's weight beside task rewards
    loss_max_clamp: Optional[float] = None  # per-token loss clamped to [-this, this]; None = not clamped
    log_prob_min_clamp: Optional[float] = None  # top-k losses: log-probs floored here; None = not floored
    tail_mass_eps: float = 1e-7  # forward_kl_topk_tail: the student's tail mass is at least this (log guard)
    # True: the negative per-token loss is a reward for a PPO-clipped policy gradient (Thinking Machines' OPD;
    # recommended with k1). False: the loss is backpropagated directly (GKD; k3 or forward_kl_topk).
    use_policy_gradient: bool = False
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
    # in verl's examples). Kept untyped here so that `+` can add entries; rlcore.config.distill_schema.teachers
    # reads each over TeacherModelConfig's defaults. `teacher_model` is verl's single-teacher entry; a teacher
    # without model_path is unused.
    teacher_models: Dict[str, Any] = field(default_factory=lambda: {"teacher_model": asdict(TeacherModelConfig())})
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)


# ---------------------------------------------------------------------------------------------------- rules
# Rules of on-policy distillation (`distillation.*`; rlcore/algos/distill.py), and
# the one reading of its teachers that the workers, the trainer and the doctor share.
#
# `get(key)` reads the composed config. This module imports neither torch nor ray.


D = "distillation"
ESTIMATOR_MODES = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs")  # single-sample estimators of reverse KL
TOPK_MODES = ("forward_kl_topk", "forward_kl_topk_tail")  # teacher top-k forward KL
LOSS_MODES = ESTIMATOR_MODES + TOPK_MODES
TEACHER_ENGINES = ("native", "vllm")


def distillation_enabled(get: Callable[[str], Any]) -> bool:
    return bool(get(f"{D}.enabled"))


def uses_topk(get: Callable[[str], Any]) -> bool:
    """Whether the loss reads the teacher's top-k tokens (the teacher then returns them, the student's forward
    gathers its own log-probs at them)."""
    return distillation_enabled(get) and get(f"{D}.distillation_loss.loss_mode") in TOPK_MODES


def teacher_entries(cfg) -> dict[str, TeacherModelConfig]:
    """Every `distillation.teacher_models.<name>` with a model_path, read over TeacherModelConfig's defaults, with the
    rollout's engine, dtype and temperature (verl's defaults) and the reference's micro-batching where its inference
    leaves them None. `cfg`: the composed config or its typed objects.
    Raises KeyError naming a key a teacher entry does not have."""
    out = {}
    for name, entry in (cfg.distillation.teacher_models or {}).items():
        entry = OmegaConf.to_container(entry, resolve=True) if isinstance(entry, DictConfig) else dict(entry or {})
        _check_keys(name, entry, TeacherModelConfig, f"{D}.teacher_models.{name}")
        _check_keys(name, entry.get("inference") or {}, TeacherInferenceConfig, f"{D}.teacher_models.{name}.inference")
        if not entry.get("model_path"):
            continue
        teacher = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TeacherModelConfig), entry))
        rollout, ref, inference = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref, teacher.inference
        for key in ("name", "dtype", "temperature"):
            if getattr(inference, key) is None:
                setattr(inference, key, getattr(rollout, key))
        for key in ("log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"):
            if getattr(inference, key) is None:  # a forward of the same samples as the reference's: its micro-batches
                setattr(inference, key, getattr(ref, key))
        out[str(name)] = teacher
    return out


def _check_keys(name: str, entry: dict, schema, prefix: str) -> None:
    known = [f.name for f in fields(schema)]
    for key in entry:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            raise KeyError(f"{prefix}.{key} is not a key of a teacher" + (f"; did you mean {prefix}.{close[0]}?" if close else
                                                                           f"; its keys: {', '.join(known)}"))


def teacher_of_rows(keys: list, teachers: dict[str, TeacherModelConfig], teacher_key: str) -> list[str]:
    """The teacher each row goes to: the one whose `key` is the row's `teacher_key` value; with one teacher, that
    one. A row no teacher claims is an error naming its value (the data and the config disagree)."""
    if len(teachers) == 1:
        return [next(iter(teachers))] * len(keys)
    by_key = {str(t.key): name for name, t in teachers.items()}
    unknown = sorted({str(k) for k in keys} - set(by_key))
    if unknown:
        raise ValueError(f"rows with {teacher_key}={unknown[0]!r} have no teacher: the teachers' keys are {sorted(by_key)} "
                         f"(distillation.teacher_models.<name>.key); add a teacher with key={unknown[0]!r}")
    return [by_key[str(k)] for k in keys]


def replica_world_size(teacher: TeacherModelConfig) -> int:
    """Devices one replica of a vLLM teacher takes (verl: TP x DP x PP of its inference)."""
    return replica_world_size_of(teacher.inference)


def replica_world_size_of(i: TeacherInferenceConfig) -> int:
    return i.tensor_model_parallel_size * i.data_parallel_size * i.pipeline_model_parallel_size


def distillation_warnings(get: Callable[[str], Any]) -> list[str]:
    """verl's warning: a top-k loss as a policy-gradient reward uses only the sampled token's gradient."""
    loss = f"{D}.distillation_loss"
    lo = get(loss)
    if uses_topk(get) and lo.use_policy_gradient:
        return [f"{loss}.loss_mode={lo.loss_mode} with {loss}.use_policy_gradient=True: the update moves only the "
                "sampled token's log-prob, so the teacher's top-k (how the other logits should move) is mostly unused; "
                f"{loss}.use_policy_gradient=False backpropagates it (verl's advice)"]
    return []


def check_distillation(c) -> None:
    """`c`: validate's checker (get / error / choice / cfg)."""
    get = c.get
    if not distillation_enabled(get):
        return
    loss = f"{D}.distillation_loss"
    lo = get(loss)
    c.choice(f"{loss}.loss_mode", LOSS_MODES)
    mode, pg = lo.loss_mode, lo.use_policy_gradient
    if mode in ("k1", "kl") and not pg:
        # verl's rule: d(log pi - log teacher)/d theta = d log pi / d theta, whatever the teacher says
        c.error(f"{loss}.loss_mode={mode} with {loss}.use_policy_gradient=False: the gradient of k1 does not depend on the "
                f"teacher's log-probs, so it would not distil; use {loss}.use_policy_gradient=True or {loss}.loss_mode=k3")
    if mode in TOPK_MODES and (lo.topk or 0) < 1:
        c.error(f"{loss}.topk={lo.topk}: {mode} needs the teacher's top-k tokens; use {loss}.topk=64")
    if lo.policy_loss_mode != "vanilla":
        c.error(f"{loss}.policy_loss_mode={lo.policy_loss_mode}: the policy-gradient form uses the vanilla PPO "
                f"loss (verl's only one); use {loss}.policy_loss_mode=vanilla")
    if not lo.use_task_rewards and lo.distillation_loss_coef != 1.0:
        c.error(f"{loss}.distillation_loss_coef weighs the distillation loss beside the task rewards; with "
                f"{loss}.use_task_rewards=False it would do nothing: drop it or set {loss}.use_task_rewards=True")
    if mode in TOPK_MODES and get("actor_rollout_ref.actor.strategy") == "megatron":
        c.error(f"{loss}.loss_mode={mode} with a Megatron student: its vocabulary-parallel head does not yet gather the "
                f"student's log-probs at the teacher's top-k ids; use {loss}.loss_mode=k3 (or k1 with the policy gradient), "
                "or the fsdp2 strategy")
    if mode in TOPK_MODES and (get("actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1) > 1:
        c.error(f"{loss}.loss_mode={mode} with Ulysses sequence parallelism: the teacher's top-k ids are not yet sliced "
                f"with the sequence; use {loss}.loss_mode=k3 or actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")
    if not get("actor_rollout_ref.hybrid_engine"):
        c.error(f"{D}.enabled=True with actor_rollout_ref.hybrid_engine=False: teacher scoring of the split pools' stale "
                "samples is not built (each would need the teacher's pass as it arrives); use the hybrid engine")
    try:
        teachers = teacher_entries(c.cfg)
    except KeyError as err:
        c.error(err.args[0])
        return
    if not teachers:
        c.error(f"{D}.enabled=True but no teacher has a model_path; set {D}.teacher_models.teacher_model.model_path=<dir>")
        return
    _check_teachers(c, teachers)
    _check_pool(c, teachers)


def _check_teachers(c, teachers: dict[str, TeacherModelConfig]) -> None:
    keys = [t.key for t in teachers.values()]
    if len(teachers) > 1 and (None in keys or len(set(keys)) != len(keys)):
        c.error(f"{len(teachers)} teachers ({', '.join(teachers)}) need a distinct {D}.teacher_models.<name>.key each: the "
                f"value of {D}.teacher_key={c.cfg.distillation.teacher_key} whose rows it scores (keys now: {keys})")
    for name, t in teachers.items():
        prefix = f"{D}.teacher_models.{name}.inference"
        if t.inference.name not in TEACHER_ENGINES:
            c.error(f"{prefix}.name={t.inference.name} is not one of {', '.join(TEACHER_ENGINES)}; use {prefix}.name=native")
        elif t.inference.name == "vllm":
            _check_vllm_teacher(c, prefix, t.inference)
        if t.inference.name == "vllm" and t.inference.temperature != 1.0:
            # vLLM computes prompt log-probs from the raw logits whatever the request's temperature (measured, 0.32)
            c.error(f"{prefix}.temperature={t.inference.temperature}: a vLLM teacher's prompt log-probs are of the unscaled "
                    f"logits; use {prefix}.temperature=1.0 (and a rollout at temperature 1), or {prefix}.name=native")
        if t.inference.temperature is not None and t.inference.temperature <= 0:
            c.error(f"{prefix}.temperature={t.inference.temperature}: the teacher's log-probs are of softmax(logits / "
                    f"temperature); use {prefix}.temperature=1.0")


def _check_vllm_teacher(c, prefix: str, inference: TeacherInferenceConfig) -> None:
    """A vLLM teacher's engine spans one TP group of the teacher's ranks; its data-parallel replicas are more such
    groups, so tensor x data parallel must tile the group's nodes (checked with the pool below)."""
    tp, ep = inference.tensor_model_parallel_size, inference.expert_parallel_size
    if inference.pipeline_model_parallel_size != 1:
        c.error(f"{prefix}.pipeline_model_parallel_size={inference.pipeline_model_parallel_size}: rlcore's vLLM engines run "
                f"tensor parallel only; use {prefix}.tensor_model_parallel_size={tp * inference.pipeline_model_parallel_size} "
                f"and {prefix}.pipeline_model_parallel_size=1")
    if ep not in (1, tp):
        c.error(f"{prefix}.expert_parallel_size={ep} must be 1 or {prefix}.tensor_model_parallel_size={tp} (one vLLM "
                f"engine spans one TP group)")
    if not c.cfg.distillation.n_gpus_per_node:  # colocated with the actor: a TP group must not straddle its nodes
        per_node = c.cfg.trainer.n_gpus_per_node
        if per_node % replica_world_size_of(inference):
            c.error(f"{prefix}: a replica of {replica_world_size_of(inference)} devices (tensor x data parallel) does not "
                    f"tile trainer.n_gpus_per_node={per_node}, whose devices the teacher shares; use a "
                    f"tensor_model_parallel_size dividing {per_node}")


def _check_pool(c, teachers: dict[str, TeacherModelConfig]) -> None:
    """verl's pool arithmetic: replicas x per-replica world size fill the pool, and no replica straddles a node."""
    per_node, nodes = c.cfg.distillation.n_gpus_per_node, c.cfg.distillation.nnodes
    if not per_node and not nodes:
        return  # colocated with the actor (the doctor says so)
    if not per_node or not nodes:
        c.error(f"{D}.n_gpus_per_node={per_node} and {D}.nnodes={nodes}: a teacher pool of its own needs both (or neither, "
                f"to share the actor's devices); use {D}.nnodes=1")
        return
    pool = per_node * nodes
    used = 0
    for name, t in teachers.items():
        world = replica_world_size(t) if t.inference.name == "vllm" else 1
        if world > per_node or per_node % world:
            c.error(f"{D}.teacher_models.{name}: a replica of {world} devices would straddle nodes of {per_node}; use a "
                    f"tensor_model_parallel_size dividing {D}.n_gpus_per_node={per_node}")
        if t.inference.name == "native" and t.num_replicas not in (0, 1):
            c.error(f"{D}.teacher_models.{name}.num_replicas={t.num_replicas}: a native teacher is one model sharded over the "
                    f"whole teacher pool ({pool} devices); use num_replicas=1 (or 0)")
        used += (t.num_replicas or 0) * world
    if any(t.num_replicas for t in teachers.values()) and any(t.inference.name == "vllm" for t in teachers.values()) and used != pool:
        c.error(f"the teachers' replicas take {used} devices (num_replicas x tensor x data x pipeline parallel, summed) but the "
                f"teacher pool has {pool} ({D}.nnodes={nodes} x {D}.n_gpus_per_node={per_node}); make them equal")
