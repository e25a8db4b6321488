"""The rollout's part of the config tree (`actor_rollout_ref.rollout.*`, verl's rollout/rollout.yaml): the generation
engine, its sampling, how the trainer's weights reach it, and its multi-turn settings (rlcore/config/multi_turn_schema.py).
Conventions as in rlcore/config/schema.py (enumerations are `str` with the allowed values in the comment, checked by
validate_rollout.py; `II(...)` defaults follow another key as in verl's YAML).

This module imports neither torch nor ray.
"""

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
    calculate_log_probs: bool = False  # also return the engine's own log-probs (for mismatch metrics)
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
