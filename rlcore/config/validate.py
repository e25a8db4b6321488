"""Checks a composed PPO config and derives every batch size, before Ray starts.

`validate_config(cfg)` collects ALL violations and raises one `ConfigError` listing them; each message names the
key(s), the value(s), the rule and a valid alternative computed from the numbers. On success it returns a
`BatchPlan` that the trainer prints with `format_plan` and can use instead of re-deriving sizes.

Units (verl semantics): data.train_batch_size and actor.ppo_mini_batch_size count PROMPTS; each prompt becomes
rollout.n SAMPLES; `*_per_gpu` sizes count SAMPLES per data-parallel rank. dp = world / ulysses_sp.

This module imports neither torch nor ray.
"""

import difflib
import math
from dataclasses import dataclass, is_dataclass
from typing import Any, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from rlcore.config.actor_schema import check_policy_loss, check_prefix_grouper
from rlcore.config.algorithm_schema import (
    OTB_ESTIMATORS,
    check_dynamic_sampling,
    check_gdpo,
    check_otb,
    check_overlong_buffer,
    check_pf_ppo,
    check_rollout_correction,
    rollout_correction_warnings,
)
from rlcore.config.async_schema import check_async, check_trainer_mode, derive_async_sizes, split_pools
from rlcore.config.distill_schema import check_distillation
from rlcore.config.fsdp_schema import check_ulysses, ppo_engine_errors, role_sp, sp_key
from rlcore.config.keys import unknown_key_errors
from rlcore.config.lora_schema import check_lora
from rlcore.config.megatron_schema import _megatron_model_parallel, check_megatron, check_same_layout
from rlcore.config.moe_schema import check_router_replay
from rlcore.config.multi_turn_schema import check_multi_turn
from rlcore.config.names import KL_ESTIMATORS, LOSS_AGG_MODES
from rlcore.config.profiler_schema import check_profiler, profiler_warnings
from rlcore.config.renamed import renamed_errors
from rlcore.config.reward_model_schema import check_reward_manager, check_reward_model
from rlcore.config.rollout_schema import check_native_rollout, check_over_sample_rate, check_rollout_expert_parallel, check_rollout_v09, check_vllm_rollout
from rlcore.config.suggest import _divisors, _nearest, _suggest, _use

ARR = "actor_rollout_ref"
STRATEGIES = ("fsdp", "fsdp2", "megatron")
ROLLOUT_NAMES = ("native", "vllm", "hf")
ROLLOUT_MODES = ("sync", "async")
TRUNCATIONS = ("error", "left", "right", "middle")
KL_CTRL_TYPES = ("fixed", "adaptive")
DEVICES = ("cuda", "cpu")
RESUME_MODES = ("auto", "disable", "resume_path")
DTYPES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")
# Baselines from the other samples of the same prompt: with n=1 each sample is its own group, and its advantage is its
# own score (verl's rule: a group of one has mean 0, std 1); grpo_passk needs two samples and cannot run at all.
PAIR_ESTIMATORS = ("grpo_passk",)
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo", "reinforce_plus_plus_baseline", "gpg", "gdpo", *OTB_ESTIMATORS)

_UNSUPPORTED_ROLLOUT = {"sglang": "is not supported yet by rlcore; use {key}=vllm or {key}=native"}
_UNSUPPORTED_DEVICE = {"npu": "is not supported by rlcore; use {key}=cuda or {key}=cpu"}
MODEL_ENGINES = ("dp", "megatron")
_UNSUPPORTED_ENGINE = {
    "torchtitan": "is verl's TorchTitan training engine, which rlcore does not have; use {key}=dp (rlcore's FSDP2 engine: "
                  "fsdp_config.*, ulysses_sequence_parallel_size) or {key}=megatron (tensor, pipeline and expert parallelism)",
    "veomni": "is verl's VeOmni training engine, which rlcore does not have; use {key}=dp (rlcore's FSDP2 engine: fsdp_config.*, "
              "ulysses_sequence_parallel_size for VeOmni's ulysses_parallel_size) or {key}=megatron (expert parallelism, "
              "for VeOmni's expert_parallel_size)",
}


class ConfigError(ValueError):
    """Invalid user configuration; `messages` holds every violation found, each with its fix."""

    def __init__(self, messages: Sequence[str]):
        self.messages = list(messages)
        super().__init__(self.messages)

    def __str__(self) -> str:
        lines = [f"{len(self.messages)} config error(s):"]
        lines += [f"  {i}. {message}" for i, message in enumerate(self.messages, 1)]
        return "\n".join(lines)


@dataclass(frozen=True)
class BatchPlan:
    """Sizes of one training step derived from the config (prompts, samples, mini- and micro-batches)."""

    world_size: int  # ranks = trainer.nnodes x trainer.n_gpus_per_node
    dp_size: int  # data-parallel ranks = world_size / ulysses_sequence_parallel_size
    prompts_per_step: int  # data.train_batch_size
    samples_per_step: int  # prompts_per_step x rollout.n
    mini_batches_per_step: int  # train_batch_size / ppo_mini_batch_size
    samples_per_mini_batch: int  # ppo_mini_batch_size x rollout.n
    samples_per_mini_batch_per_rank: int  # samples_per_mini_batch / dp_size
    micro_batches_per_mini_batch_per_rank: Optional[int]  # None under use_dynamic_bsz (token budgets)
    samples_per_rank_per_step: int  # samples_per_step / dp_size
    optimizer_steps_per_step: int  # mini_batches_per_step x ppo_epochs
    ppo_micro_batch_size_per_rank: Optional[int]  # resolved from *_per_gpu or the deprecated global key
    log_prob_micro_batch_size_per_rank: Optional[int]  # rollout (old log-prob) micro-batch; None = dynamic
    ref_log_prob_micro_batch_size_per_rank: Optional[int]  # None = dynamic or no reference policy
    use_reference_policy: bool  # actor.use_kl_loss or algorithm.use_kl_in_reward
    use_critic: bool = False  # critic.enable, or (null) adv_estimator == gae
    critic_micro_batches_per_mini_batch_per_rank: Optional[int] = None  # None = no critic or dynamic
    critic_micro_batch_size_per_rank: Optional[int] = None  # resolved as the actor's; None = no critic or dynamic
    ppo_max_token_len_per_rank: Optional[int] = None  # use_dynamic_bsz: the update's token budget per micro-batch
    max_sequence_length: int = 0  # data.max_prompt_length + data.max_response_length


# ----------------------------------------------------------------------------------------------- helpers


class _Checker:
    """Accumulates violation messages for one config."""

    def __init__(self, cfg: DictConfig, heads: Optional[tuple[int, int]] = None):
        self.cfg = cfg
        self.errors: List[str] = []
        self.heads = heads  # the policy's (attention heads, KV heads) when known: fixes must split them

    def rollout_tp_splits_heads(self, tp: int) -> bool:
        """vLLM's rule (rlcore/plan/heads.py names a violation; this keeps the node rule's fixes inside it)."""
        if self.heads is None:
            return True
        heads, kv = self.heads
        return heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)

    def batch_splits(self, dp: int) -> bool:
        """Whether a step's and a mini-batch's samples split evenly over `dp` data-parallel ranks (so that a layout
        fix does not trade one error for a batch one)."""
        n, tbs, mini = (self.get(k) for k in (f"{ARR}.rollout.n", "data.train_batch_size", f"{ARR}.actor.ppo_mini_batch_size"))
        return all(isinstance(x, int) and x > 0 for x in (n, tbs, mini)) and tbs * n % dp == 0 and mini * n % dp == 0

    def megatron_tp_splits_heads(self, tp: int) -> bool:
        return self.heads is None or self.heads[0] % tp == 0 and self.heads[1] % tp == 0

    def get(self, key: str) -> Any:
        return OmegaConf.select(self.cfg, key, throw_on_missing=True)

    def error(self, message: str) -> None:
        self.errors.append(message)

    def choice(self, key: str, allowed: Sequence[str], unsupported: Optional[dict] = None) -> None:
        value = self.get(key)
        if value in allowed:
            return
        if unsupported and value in unsupported:
            self.error(f"{key}={value} " + unsupported[value].format(key=key))
            return
        close = difflib.get_close_matches(str(value), allowed, n=1) or [allowed[0]]
        self.error(f"{key}={value} is not one of {', '.join(allowed)}; use {key}={close[0]}")

    def at_least(self, key: str, minimum: int, fix: Optional[int] = None) -> bool:
        value = self.get(key)
        if value is not None and value >= minimum:
            return True
        self.error(f"{key}={value} must be >= {minimum}; use {key}={minimum if fix is None else fix}")
        return False

    def minus_one_or_positive(self, key: str) -> None:
        value = self.get(key)
        if value != -1 and value <= 0:
            self.error(f"{key}={value} must be -1 (never) or > 0 (every N steps); use {key}=-1 or {key}=1")


# ----------------------------------------------------------------------------------- value rules


def _check_choices(c: _Checker) -> None:
    c.choice("model_engine", MODEL_ENGINES, _UNSUPPORTED_ENGINE)
    # model_engine is verl 0.9's group that sets the strategies; an explicit strategy against it would train on
    # another engine than the one named (model_engine=dp beside strategy=megatron is verl 0.8's way: accepted)
    if c.cfg.model_engine == "megatron" and c.cfg.actor_rollout_ref.actor.strategy != "megatron":
        c.error(f"model_engine=megatron trains on Megatron, but {ARR}.actor.strategy={c.cfg.actor_rollout_ref.actor.strategy}; "
                f"drop the strategy override (the group sets it), or use model_engine=dp for FSDP2")
    c.choice(f"{ARR}.actor.strategy", STRATEGIES)
    if c.cfg.actor_rollout_ref.ref.strategy != c.cfg.actor_rollout_ref.actor.strategy:
        c.choice(f"{ARR}.ref.strategy", STRATEGIES)
    c.choice(f"{ARR}.rollout.name", ROLLOUT_NAMES, _UNSUPPORTED_ROLLOUT)
    c.choice(f"{ARR}.rollout.checkpoint_engine.backend", ("naive",))
    c.at_least(f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes", 0, 2048)  # 0: one tensor per gather
    c.choice(f"{ARR}.rollout.mode", ROLLOUT_MODES)
    c.choice("data.truncation", TRUNCATIONS)
    c.choice("data.return_multi_modal_inputs", (True,), {False: "is not supported: a vision-language policy's training forward "
                                                                "reads each row's processor tensors; leave {key}=True"})
    c.choice(f"{ARR}.actor.loss_agg_mode", LOSS_AGG_MODES)
    c.choice(f"{ARR}.actor.kl_loss_type", KL_ESTIMATORS)
    c.choice("algorithm.kl_penalty", KL_ESTIMATORS)
    c.choice("algorithm.kl_ctrl.type", KL_CTRL_TYPES)
    c.choice("trainer.device", DEVICES, _UNSUPPORTED_DEVICE)
    c.choice("trainer.verbosity", ("full", "short"))
    c.choice("trainer.resume_mode", RESUME_MODES)
    for role in ("actor", "ref"):
        c.choice(f"{ARR}.{role}.fsdp_config.dtype", DTYPES)
        c.choice(f"{ARR}.{role}.fsdp_config.model_dtype", DTYPES)
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(getattr(c.cfg.actor_rollout_ref, role).fsdp_config.mixed_precision, name) is not None:
                c.choice(f"{ARR}.{role}.fsdp_config.mixed_precision.{name}", DTYPES)
    c.choice(f"{ARR}.rollout.dtype", DTYPES)
    check_reward_manager(c)
    check_overlong_buffer(c)
    check_dynamic_sampling(c)
    check_pf_ppo(c)
    check_otb(c)
    check_gdpo(c)
    check_policy_loss(c)
    check_distillation(c)
    check_prefix_grouper(c)
    check_rollout_correction(c)
    check_router_replay(c)
    check_profiler(c)
    check_native_rollout(c)
    check_rollout_v09(c)
    check_over_sample_rate(c)
    _check_data_and_trainer(c)
    if c.cfg.actor_rollout_ref.actor.strategy == "megatron":
        check_megatron(c, f"{ARR}.actor.megatron")
        # The reference is built by the same engine from its own section: what the engine cannot do is refused
        # there too, whether or not this run uses a reference (a key set and ignored is worse than a refusal).
        check_megatron(c, f"{ARR}.ref.megatron")
        c.choice(f"{ARR}.actor.megatron.dtype", DTYPES)
        if uses_reference(c.cfg):
            check_same_layout(c, f"{ARR}.ref.megatron", f"{ARR}.actor.megatron")
    if uses_critic(c.cfg):
        c.choice("critic.strategy", STRATEGIES)
        if c.cfg.critic.strategy == "megatron":
            check_megatron(c, "critic.megatron")
            c.choice("critic.megatron.dtype", DTYPES)
        c.choice("critic.loss_agg_mode", LOSS_AGG_MODES)
        c.choice("critic.fsdp.dtype", DTYPES)


def _check_data_and_trainer(c: _Checker) -> None:
    """verl 0.9's data and trainer keys for what rlcore does not do."""
    if c.cfg.data.mm_processor_kwargs:
        c.error(f"data.mm_processor_kwargs={dict(c.cfg.data.mm_processor_kwargs)}: rlcore calls a vision-language model's "
                f"processor as saved beside the model (preprocessor_config.json); set those values there, or drop the key")
    if c.cfg.trainer.default_hdfs_dir:
        c.error(f"trainer.default_hdfs_dir={c.cfg.trainer.default_hdfs_dir}: rlcore writes checkpoints to "
                f"trainer.default_local_dir only (it has no HDFS client); copy them with your own tool, or mount the "
                f"HDFS path and point default_local_dir at it")


def _check_unsupported(c: _Checker) -> None:
    for role in ("actor", "ref", "critic", "reward_model"):
        if (role != "critic" or uses_critic(c.cfg)) and (role != "reward_model" or c.cfg.reward.reward_model.enable):
            check_ulysses(c, role)
    for model, strategy in ((f"{ARR}.model", f"{ARR}.actor.strategy"), ("critic.model", "critic.strategy")):
        if model == "critic.model" and not uses_critic(c.cfg):
            continue
        check_lora(c, model, strategy)
    if c.cfg.algorithm.adv_estimator == "gae" and c.cfg.critic.enable is False:
        c.error("algorithm.adv_estimator=gae needs the critic's values but critic.enable=False; use critic.enable=null "
                "(on for gae) or a critic-free estimator such as algorithm.adv_estimator=grpo")
    c.errors += ppo_engine_errors(c.get, uses_critic(c.cfg))
    check_vllm_rollout(c)
    check_rollout_expert_parallel(c)
    check_multi_turn(c)
    check_reward_model(c)
    check_trainer_mode(c)
    check_async(c)


def _check_sampling(c: _Checker, prefix: str) -> None:
    c.at_least(f"{prefix}.n", 1)
    key = f"{prefix}.temperature"
    if c.get(key) < 0:
        c.error(f"{key}={c.get(key)} must be >= 0 (0 = greedy); use {key}=1.0 or {key}=0")
    key = f"{prefix}.top_p"
    if not 0 < c.get(key) <= 1:
        c.error(f"{key}={c.get(key)} must be in (0, 1]; use {key}=1.0 (off) or e.g. {key}=0.95")
    key = f"{prefix}.top_k"
    if c.get(key) < -1:
        c.error(f"{key}={c.get(key)} must be -1 (off) or >= 0; use {key}=-1")


def _check_ranges(c: _Checker) -> None:
    rollout, actor = f"{ARR}.rollout", f"{ARR}.actor"
    estimator, n = c.cfg.algorithm.adv_estimator, c.cfg.actor_rollout_ref.rollout.n
    if estimator in PAIR_ESTIMATORS and n == 1:  # verl raises at the first step; the others run (config_warnings)
        c.error(f"algorithm.adv_estimator={estimator} compares each prompt's best sample with its second best, so "
                f"{rollout}.n=1 cannot run (verl stops at the first step too); use {rollout}.n=4 or more")
    _check_sampling(c, rollout)
    _check_sampling(c, f"{rollout}.val_kwargs")
    key = f"{rollout}.gpu_memory_utilization"
    if not 0 < c.get(key) <= 1:
        c.error(f"{key}={c.get(key)} must be in (0, 1]; use {key}=0.5")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        key = f"{actor}.{name}"
        if c.get(key) <= 0:
            c.error(f"{key}={c.get(key)} must be > 0 (the PPO clip epsilon); use {key}=0.2")
    key = f"{actor}.clip_ratio_c"
    if c.get(key) <= 1:
        c.error(f"{key}={c.get(key)} must be > 1 (dual-clip bound on the ratio for negative advantages); use {key}=3.0")
    key = f"{actor}.optim.lr"
    if c.get(key) <= 0:
        c.error(f"{key}={c.get(key)} must be > 0; use e.g. {key}=1e-6")
    key = f"{actor}.optim.lr_warmup_steps_ratio"
    if not 0 <= c.get(key) <= 1:
        c.error(f"{key}={c.get(key)} must be in [0, 1]; use {key}=0.0")
    c.at_least(f"{actor}.ppo_epochs", 1)
    c.at_least("data.max_prompt_length", 1, fix=512)
    c.at_least("data.max_response_length", 1, fix=512)
    if c.cfg.data.val_batch_size is not None:
        c.at_least("data.val_batch_size", 1)
    _check_trainer(c)


def _check_trainer(c: _Checker) -> None:
    steps, epochs = c.cfg.trainer.total_training_steps, c.cfg.trainer.total_epochs
    if steps is not None and steps <= 0:
        c.error(f"trainer.total_training_steps={steps} must be > 0, or null to run trainer.total_epochs; "
                "use trainer.total_training_steps=null or e.g. trainer.total_training_steps=100")
    elif steps is None and epochs <= 0:
        c.error(f"trainer.total_epochs={epochs} with trainer.total_training_steps=null trains nothing; "
                "use trainer.total_epochs=1 or set trainer.total_training_steps")
    c.minus_one_or_positive("trainer.test_freq")
    c.minus_one_or_positive("trainer.save_freq")
    if c.cfg.trainer.resume_mode == "resume_path" and not c.cfg.trainer.resume_from_path:
        c.error("trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint folder such as "
                "<default_local_dir>/global_step_100); set it or use trainer.resume_mode=auto")
    for key in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"):
        if c.get(key) is not None:
            c.at_least(key, 1)
    c.at_least("trainer.log_val_generations", 0)


def _check_token_budget(c: _Checker, key: str, need: int) -> None:
    """A budget below the longest possible sample runs, as in verl, until a sample longer than it comes (then the
    pass stops, as verl's assert does): config_warnings says so. Only a budget no sample fits is refused."""
    value = c.get(key)
    if value < 2:
        c.error(f"{key}={value} fits no sample (a prompt token and a response token at least); use {key}={need}")


def config_warnings(cfg: DictConfig) -> list[str]:
    """What verl runs and rlcore runs too, but which is likely not what the user meant: said before the run starts."""
    warnings, arr = [], cfg.actor_rollout_ref
    estimator, n = cfg.algorithm.adv_estimator, arr.rollout.n
    if estimator in GROUP_ESTIMATORS and estimator not in PAIR_ESTIMATORS and n == 1:
        warnings.append(f"algorithm.adv_estimator={estimator} with {ARR}.rollout.n=1: each sample is its own group, so its "
                        f"advantage is its own score, with no baseline (verl's rule for a group of one); fine for "
                        f"distillation or evaluation runs, otherwise use {ARR}.rollout.n=4 or more")
    warnings += rollout_correction_warnings(cfg) + profiler_warnings(cfg)
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    budgets = [(f"{ARR}.actor.ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz),
               (f"{ARR}.rollout.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz),
               (f"{ARR}.ref.log_prob_max_token_len_per_gpu", uses_reference(cfg) and arr.ref.log_prob_use_dynamic_bsz),
               ("critic.ppo_max_token_len_per_gpu", uses_critic(cfg) and cfg.critic.use_dynamic_bsz),
               ("critic.forward_max_token_len_per_gpu", uses_critic(cfg) and cfg.critic.use_dynamic_bsz)]
    for key, used in budgets:
        value = OmegaConf.select(cfg, key)
        if used and 2 <= value < need:
            warnings.append(f"{key}={value} is smaller than data.max_prompt_length + data.max_response_length = {need} "
                            f"tokens: a sample longer than {value} tokens stops the run when it comes (as in verl); use "
                            f"{key}={need} to be sure")
    return warnings


# ----------------------------------------------------------------------------------- batch sizes


def _micro_per_rank(c: _Checker, prefix: str, base: str, dynamic_key: str, dp: int,
                    fits: Optional[int], default_cap: int) -> Optional[int]:
    """Resolves `{prefix}.{base}_per_gpu` or the deprecated global `{prefix}.{base}` to SAMPLES per rank.

    `fits` is a per-rank sample count the micro size should divide (used only to suggest a value)."""
    per_key, global_key = f"{prefix}.{base}_per_gpu", f"{prefix}.{base}"
    per_gpu, total = c.get(per_key), c.get(global_key)
    if c.get(dynamic_key):
        return None
    example = max(d for d in _divisors(fits) if d <= default_cap) if fits else default_cap
    if per_gpu is not None and total is not None:
        c.error(f"{per_key}={per_gpu} and the deprecated {global_key}={total} are both set; "
                f"set only {per_key} (remove {global_key})")
        return None
    if per_gpu is None and total is None:
        c.error(f"{per_key} is required unless {dynamic_key}=True (token budgets); use e.g. {per_key}={example} "
                f"(samples per forward pass per rank), or {dynamic_key}=True")
        return None
    if per_gpu is not None:
        return per_gpu if c.at_least(per_key, 1, fix=example) else None
    if total < 1 or total % dp:
        c.error(f"deprecated {global_key}={total} (samples over all ranks) is not a positive multiple of {dp} "
                f"data-parallel ranks; use {per_key}={max(1, total // dp) if total >= dp else example} instead")
        return None
    return total // dp


def _plan(c: _Checker) -> Optional[BatchPlan]:
    """Derives the batch plan, reporting divisibility violations; None when sizes are inconsistent."""
    actor, rollout = f"{ARR}.actor", f"{ARR}.rollout"
    ok = all([c.at_least("trainer.nnodes", 1), c.at_least("trainer.n_gpus_per_node", 1),
              c.at_least("data.train_batch_size", 1),
              c.at_least(f"{actor}.ppo_mini_batch_size", 1)])
    nodes, per_node = c.cfg.trainer.nnodes, c.cfg.trainer.n_gpus_per_node
    sp = role_sp(c.get, "actor")
    a = c.cfg.actor_rollout_ref.actor
    n, epochs = c.cfg.actor_rollout_ref.rollout.n, a.ppo_epochs
    if not ok or n < 1 or epochs < 1:  # n and ppo_epochs are reported by _check_ranges
        return None
    world = nodes * per_node
    _check_rollout_tp(c, per_node)
    if a.strategy == "megatron":
        sp = _megatron_model_parallel(c, f"{actor}.megatron", world, per_node)
        if sp is None:
            return None
    elif world % sp or per_node % sp:
        # An sp group exchanges activations twice per layer (all-to-all): it stays inside a node, as verl's.
        key = sp_key(c.get, "actor")
        c.error(f"{key}={sp} must divide the ranks per node (trainer.n_gpus_per_node={per_node}) and the world size "
                f"{world}: a sequence-parallel group runs two all-to-alls per layer and stays inside a node; "
                + _use(key, _nearest(sp, lambda v: world % v == 0 and per_node % v == 0, 1, per_node)))
        return None
    dp = world // sp
    tbs, mini = c.cfg.data.train_batch_size, a.ppo_mini_batch_size
    step_ok = tbs * n % dp == 0
    if not step_ok:
        fixes = _suggest(tbs, [lambda t: t * n % dp == 0 and t % mini == 0, lambda t: t * n % dp == 0],
                         1, 4 * (tbs + dp))
        c.error(f"data.train_batch_size={tbs} x {rollout}.n={n} = {tbs * n} samples per step is not divisible by "
                f"{dp} data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node / ulysses_sequence_parallel_size"
                f"); " + _use("data.train_batch_size", fixes))
    mini_batches, per_rank_mini, micro, micro_batches = _plan_mini_batches(c, dp, tbs, mini, n)
    per_rank_step = tbs * n // dp if step_ok else None
    log_prob_micro, ref_micro, use_ref = _check_log_prob_sizes(c, dp, per_rank_step)
    use_critic = uses_critic(c.cfg)
    critic_micro, critic_rows = _plan_critic(c, world, tbs, n) if use_critic else (None, None)
    dynamic = a.use_dynamic_bsz
    if not step_ok or mini_batches is None or (not dynamic and micro_batches is None):
        return None
    return BatchPlan(
        world_size=world, dp_size=dp, prompts_per_step=tbs, samples_per_step=tbs * n,
        mini_batches_per_step=mini_batches, samples_per_mini_batch=mini * n,
        samples_per_mini_batch_per_rank=per_rank_mini, micro_batches_per_mini_batch_per_rank=micro_batches,
        samples_per_rank_per_step=per_rank_step, optimizer_steps_per_step=mini_batches * epochs,
        ppo_micro_batch_size_per_rank=micro, log_prob_micro_batch_size_per_rank=log_prob_micro,
        ref_log_prob_micro_batch_size_per_rank=ref_micro, use_reference_policy=use_ref,
        use_critic=use_critic, critic_micro_batches_per_mini_batch_per_rank=critic_micro, critic_micro_batch_size_per_rank=critic_rows,
        ppo_max_token_len_per_rank=a.ppo_max_token_len_per_gpu if dynamic else None,
        max_sequence_length=c.cfg.data.max_prompt_length + c.cfg.data.max_response_length,
    )


def _plan_mini_batches(c: _Checker, dp: int, tbs: int, mini: int, n: int, actor: str = f"{ARR}.actor"):
    """Checks mini- and micro-batch divisibility of `actor` (the actor's or the critic's section: same key names).
    Returns (mini_batches_per_step, per-rank mini-batch samples, micro-batch size per rank, micro-batches per
    mini-batch per rank), each None where it cannot be derived."""
    rollout = f"{ARR}.rollout"
    mini_key = f"{actor}.ppo_mini_batch_size"
    mini_fits = mini * n % dp == 0
    per_rank_mini = mini * n // dp if mini_fits else None
    micro = _micro_per_rank(c, actor, "ppo_micro_batch_size", f"{actor}.use_dynamic_bsz", dp,
                            per_rank_mini, default_cap=16)

    def fits(m: int) -> bool:  # whole samples per rank, and whole micro-batches per rank
        return m * n % dp == 0 and (micro is None or (m * n // dp) % micro == 0)

    divides = mini <= tbs and tbs % mini == 0
    if not divides:
        fixes = _suggest(mini, [lambda m: tbs % m == 0 and fits(m)], 1, tbs)
        rule = "is larger than" if mini > tbs else "does not divide"
        c.error(f"{mini_key}={mini} {rule} data.train_batch_size={tbs} (both count prompts; a step must split into "
                f"whole mini-batches); " + (_use(mini_key, fixes) or _with_micro(c, actor, tbs, mini, n, dp, micro)))
    if not mini_fits:
        # Only sizes that still divide the batch: a fix must not break the rule above (if the batch itself does
        # not split over the ranks, no mini-batch size can: the batch's fix comes first).
        fixes = _suggest(mini, [lambda m: tbs % m == 0 and fits(m)], 1, tbs)
        c.error(f"{mini_key}={mini} x {rollout}.n={n} = {mini * n} samples is not divisible by {dp} data-parallel "
                f"ranks; " + (_use(mini_key, fixes) or _with_micro(c, actor, tbs, mini, n, dp, micro)
                              or f"first make data.train_batch_size={tbs} a multiple of {dp // math.gcd(n, dp)} (then a "
                                 "mini-batch size dividing it will exist)"))
    micro_batches = None
    if per_rank_mini is not None and micro is not None:
        if per_rank_mini % micro == 0:
            micro_batches = per_rank_mini // micro
        elif micro > per_rank_mini:
            # verl splits a rank's mini-batch into micro-batches of at most this many samples: one, of them all (its
            # rollout-correction scripts: 32 prompts over 8 ranks with 8 per micro-batch). The loss is normalised
            # by mini-batch counts (rlcore.algos.agg), so the split does not change it.
            micro, micro_batches = per_rank_mini, 1
        else:
            per_gpu_key = f"{actor}.ppo_micro_batch_size_per_gpu"
            source = (f"{per_gpu_key}={micro}" if c.get(per_gpu_key) is not None else
                      f"{actor}.ppo_micro_batch_size={c.get(actor).ppo_micro_batch_size} / {dp} ranks = {micro}")
            fixes = _suggest(micro, [lambda m: per_rank_mini % m == 0], 1, per_rank_mini)
            c.error(f"{mini_key}={mini} x {rollout}.n={n} / {dp} ranks = {per_rank_mini} samples per rank per "
                    f"mini-batch is not divisible by {source}; " + _use(per_gpu_key, fixes))
    mini_batches = tbs // mini if divides and mini_fits else None
    return mini_batches, per_rank_mini, micro, micro_batches


def _with_micro(c: _Checker, actor: str, tbs: int, mini: int, n: int, dp: int, micro: Optional[int]) -> str:
    """A mini-batch size that divides the batch over the ranks, with the micro-batch size it then needs (one fix,
    two keys), when no mini-batch size alone satisfies both; "" when there is none or the micro-batch is not
    set per GPU."""
    per_gpu_key = f"{actor}.ppo_micro_batch_size_per_gpu"
    if micro is None or c.get(per_gpu_key) is None:
        return ""
    found = _nearest(mini, lambda m: tbs % m == 0 and m * n % dp == 0, 1, tbs)
    if not found:
        return ""
    m = found[0]
    per_rank = m * n // dp
    new_micro = max(d for d in range(1, min(micro, per_rank) + 1) if per_rank % d == 0)
    return f"use {actor}.ppo_mini_batch_size={m} {per_gpu_key}={new_micro}"


def _check_log_prob_sizes(c: _Checker, dp: int, per_rank_step: Optional[int]):
    """Rollout (old log-prob) and reference micro-batches, and every token budget.

    Returns (rollout micro per rank, ref micro per rank, use_reference_policy)."""
    actor, rollout, ref = f"{ARR}.actor", f"{ARR}.rollout", f"{ARR}.ref"
    log_prob_micro = _micro_per_rank(c, rollout, "log_prob_micro_batch_size", f"{rollout}.log_prob_use_dynamic_bsz",
                                     dp, per_rank_step, default_cap=32)
    use_ref = uses_reference(c.cfg)
    ref_micro = None
    if use_ref:
        ref_micro = _micro_per_rank(c, ref, "log_prob_micro_batch_size", f"{ref}.log_prob_use_dynamic_bsz",
                                    dp, per_rank_step, default_cap=32)
    need = c.cfg.data.max_prompt_length + c.cfg.data.max_response_length
    arr = c.cfg.actor_rollout_ref
    if arr.actor.use_dynamic_bsz:
        _check_token_budget(c, f"{actor}.ppo_max_token_len_per_gpu", need)
    if arr.rollout.log_prob_use_dynamic_bsz:
        _check_token_budget(c, f"{rollout}.log_prob_max_token_len_per_gpu", need)
    if use_ref and arr.ref.log_prob_use_dynamic_bsz:
        _check_token_budget(c, f"{ref}.log_prob_max_token_len_per_gpu", need)
    max_len = arr.rollout.max_model_len
    if max_len is not None and max_len < need:
        c.error(f"{rollout}.max_model_len={max_len} is smaller than data.max_prompt_length + data.max_response_length "
                f"= {need}; use {rollout}.max_model_len={need} or null")
    return log_prob_micro, ref_micro, use_ref


def uses_reference(cfg) -> bool:
    """Whether the run computes reference log-probs: for the KL loss (actor.use_kl_loss) or the KL penalty in the
    reward (algorithm.use_kl_in_reward). The one answer the controller, the workers, the memory plan and the rehearsal
    read (two of their own copies had dropped use_kl_in_reward). With LoRA the reference is the actor's base with the
    adapters off: the caller decides whether that needs weights of its own."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def uses_critic(cfg) -> bool:
    """critic.enable, or when it is null (verl's default) whether the estimator needs values (gae)."""
    enable = cfg.critic.enable
    return bool(enable) if enable is not None else cfg.algorithm.adv_estimator == "gae"


def _plan_critic(c: _Checker, world: int, tbs: int, n: int) -> tuple[Optional[int], Optional[int]]:
    """The critic's batch arithmetic on its own ranks (the actor's, or critic.nnodes x critic.n_gpus_per_node
    with critic.enable_resource_pool). Returns the critic's (micro-batches per mini-batch, samples per micro-batch)
    per rank, each None where it cannot be derived (or token budgets decide)."""
    if c.cfg.critic.enable_resource_pool:
        if not (c.at_least("critic.nnodes", 1) and c.at_least("critic.n_gpus_per_node", 1)):
            return None, None
        world = c.cfg.critic.nnodes * c.cfg.critic.n_gpus_per_node
    if c.cfg.critic.strategy == "megatron":
        per_node = c.cfg.critic.n_gpus_per_node if c.cfg.critic.enable_resource_pool else c.cfg.trainer.n_gpus_per_node
        model_parallel = _megatron_model_parallel(c, "critic.megatron", world, per_node)
        if model_parallel is None:
            return None, None
        world //= model_parallel  # from here on: the critic's data-parallel ranks
    elif role_sp(c.get, "critic") > 1:
        sp, key = role_sp(c.get, "critic"), "critic.ulysses_sequence_parallel_size"
        if world % sp:
            c.error(f"{key}={sp} does not divide the critic's {world} ranks; " + _use(key, _nearest(sp, lambda v: world % v == 0, 1, world)))
            return None, None
        world //= sp
    if not (c.at_least("critic.ppo_mini_batch_size", 1) and c.at_least("critic.ppo_epochs", 1)):
        return None, None
    for key in ("critic.optim.lr", "critic.cliprange_value"):
        if c.get(key) <= 0:
            c.error(f"{key}={c.get(key)} must be > 0; use {key}={1e-5 if 'lr' in key else 0.5}")
    if tbs * n % world:
        c.error(f"data.train_batch_size={tbs} x rollout.n={n} samples per step is not divisible by the critic's "
                f"{world} ranks; use critic.n_gpus_per_node (with critic.enable_resource_pool) dividing {tbs * n}")
        _plan_mini_batches(c, world, tbs, c.cfg.critic.ppo_mini_batch_size, n, actor="critic")  # shown now, not after the fix
        return None, None
    _micro_per_rank(c, "critic", "forward_micro_batch_size", "critic.use_dynamic_bsz", world, tbs * n // world, 32)
    if c.cfg.critic.use_dynamic_bsz:
        for key in ("critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"):
            _check_token_budget(c, key, c.cfg.data.max_prompt_length + c.cfg.data.max_response_length)
    _, _, rows, micro_batches = _plan_mini_batches(c, world, tbs, c.cfg.critic.ppo_mini_batch_size, n, actor="critic")
    return micro_batches, rows


def _check_rollout_tp(c: _Checker, per_node: int) -> None:
    """A rollout replica's TP group is contiguous ranks, placed node by node: inside one node, or whole nodes (verl's
    72B-and-up scripts run TP16 on nodes of 8; vLLM's external_launcher TP group spans the trainer's process group
    across nodes then)."""
    if split_pools(c.get):  # the rollout's own pool
        per_node, nodes, pool_key = c.cfg.rollout.n_gpus_per_node, c.cfg.rollout.nnodes, "rollout.n_gpus_per_node"
    else:
        nodes, pool_key = c.cfg.trainer.nnodes, "trainer.n_gpus_per_node"
    key = f"{ARR}.rollout.tensor_model_parallel_size"
    tp = c.get(key)
    if not c.at_least(key, 1) or not per_node or not nodes:
        return
    whole_nodes = tp % per_node == 0 and (per_node * nodes) % tp == 0
    if per_node % tp and not whole_nodes:
        fixes = _suggest(tp, [lambda v: per_node % v == 0 and c.rollout_tp_splits_heads(v), lambda v: per_node % v == 0], 1, per_node)
        c.error(f"{key}={tp} must divide {pool_key}={per_node}, or be whole nodes of it dividing the {per_node * nodes} "
                "devices: ranks are placed node by node, and a rollout replica's TP group (contiguous ranks) must not "
                "straddle two nodes partly; " + _use(key, fixes))


# ----------------------------------------------------------------------------------------- public


def validate_config(cfg: Any) -> BatchPlan:
    """Checks every rule at once and returns the derived batch plan.

    cfg: a composed DictConfig (or a PPOConfig instance, whose async sizes are derived as compose() derives them).
    Raises ConfigError listing every violation."""
    if is_dataclass(cfg):
        cfg = OmegaConf.structured(cfg)
        derive_async_sizes(cfg)
    plan, errors = diagnose(cfg)
    if errors:
        raise ConfigError(errors)
    assert plan is not None, "batch plan missing although no rule failed"
    return plan


def diagnose(cfg: DictConfig, heads: Optional[tuple[int, int]] = None) -> tuple[Optional[BatchPlan], List[str]]:
    """Every violation, and the batch plan whenever the sizes are consistent (even if, say, a feature is not
    supported yet: rlcore-plan still shows the sizes and memory for such a config). `heads`: the policy's
    (attention heads, KV heads) when known (rlcore.plan.heads.policy_heads), so that a suggested TP splits them."""
    checker = _Checker(cfg, heads)
    checker.errors += unknown_key_errors(cfg) + renamed_errors(cfg)
    _check_choices(checker)
    _check_unsupported(checker)
    _check_ranges(checker)
    plan = _plan(checker)
    return plan, checker.errors
