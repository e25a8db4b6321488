"""Rewards: verl 0.9's `reward.*` tree (the reward manager, its kwargs, a custom reward function, a reward model),
and the reward-model worker's own keys under `reward_model.*` (a frozen scoring model in its own worker group),
where verl 0.8's names of the `reward.*` keys are accepted too (rlcore/config/renamed.py reads them as the 0.9
keys); the fields, then their rules.

This module imports neither torch nor ray.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from rlcore.config.fsdp_schema import RewardModelFSDPConfig
from rlcore.config.names import REWARD_MANAGERS
from rlcore.config.profiler_schema import ProfilerConfig


@dataclass
class RewardLoopRolloutConfig:
    """verl's reward-loop engine serving the reward model (`reward.reward_model.rollout.*`; verl 0.8:
    `reward_model.rollout.*`): accepted, with no effect: rlcore runs the reward model's forward in its reward-model
    worker group (reward_model.use_reward_loop)."""

    name: Optional[str] = None  # vllm | sglang (verl: mandatory; nothing reads it here)
    dtype: str = "bfloat16"  # weights dtype
    gpu_memory_utilization: float = 0.5  # device memory fraction
    enforce_eager: bool = True  # no CUDA graphs
    cudagraph_capture_sizes: Optional[List[int]] = None  # graph batch sizes
    free_cache_engine: bool = True  # free the KV cache between uses
    data_parallel_size: int = 1  # engine replicas
    expert_parallel_size: int = 1  # MoE expert parallelism
    tensor_model_parallel_size: int = 2  # engine TP
    max_num_batched_tokens: int = 8192  # tokens per engine step
    max_model_len: Optional[int] = None  # context limit
    max_num_seqs: int = 1024  # concurrent sequences
    load_format: str = "auto"  # weight loading
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)  # engine arguments
    limit_images: Optional[int] = None  # multimodal limit
    enable_chunked_prefill: bool = True  # chunked prefill
    enable_prefix_caching: bool = True  # prefix cache
    disable_log_stats: bool = True  # engine stats logging
    skip_tokenizer_init: bool = False  # no tokenizer in the engine
    prompt_length: int = 2048  # max prompt tokens
    response_length: int = 2048  # max response tokens
    # verl 0.9's further engine keys (a generative judge's sampling among them)
    pipeline_model_parallel_size: int = 1  # engine PP
    layered_summon: bool = False  # gather weights layer by layer
    scheduling_policy: str = "fcfs"  # request order
    full_determinism: bool = False  # deterministic engine kernels
    seed: int = 42  # engine seed
    multi_stage_wake_up: bool = False  # wake weights and KV cache in stages
    ignore_eos: bool = False  # keep sampling past EOS
    temperature: float = 1.0  # a judge's sampling temperature
    top_k: int = -1  # a judge's top-k
    top_p: float = 1.0  # a judge's top-p
    do_sample: bool = True  # a judge samples (False: greedy)
    n: int = 1  # a judge's samples per request


@dataclass
class RewardModelModelConfig:
    """Model-based reward's network (`reward_model.model.*`)."""

    path: Optional[str] = None  # verl 0.8's name of reward.reward_model.model_path (read as that)
    input_tokenizer: Optional[str] = II("actor_rollout_ref.model.path")  # the policy's tokenizer; re-rendered in the RM's template if they differ
    external_lib: Optional[str] = II("actor_rollout_ref.model.external_lib")  # as the actor's
    trust_remote_code: bool = False  # allow custom model code
    override_config: Dict[str, Any] = field(default_factory=dict)  # HF config fields to override
    use_shm: bool = False  # copy the model to /dev/shm before loading
    use_remove_padding: bool = False  # packed (varlen) sequences
    use_fused_kernels: bool = II("actor_rollout_ref.model.use_fused_kernels")  # as the actor's
    fsdp_config: RewardModelFSDPConfig = field(default_factory=lambda: RewardModelFSDPConfig())  # sharding of the frozen model


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment in verl's DAPO-recipe form (`reward_model.overlong_buffer.*`): the same as
    reward_kwargs.overlong_buffer_cfg with max_resp_len = data.max_response_length (reward_manager=dapo)."""

    enable: bool = False  # punish responses that reach into the last `len` tokens
    len: int = 0  # buffer length in tokens
    penalty_factor: float = 0.0  # penalty at max_response_length
    log: bool = False  # log the penalty per sample (reward_extra/overlong_reward)


@dataclass
class RewardModelConfig:
    """The reward-model worker (`reward_model.*`): how rlcore's reward-model worker group runs the model that
    reward.reward_model enables, and how rule / custom scorers run; verl 0.8's names of reward.* keys (None: unset)."""

    enable: Optional[bool] = None  # verl 0.8's name of reward.reward_model.enable (read as that)
    enable_resource_pool: Optional[bool] = None  # verl 0.8's name of reward.reward_model.enable_resource_pool
    n_gpus_per_node: Optional[int] = None  # verl 0.8's name of reward.reward_model.n_gpus_per_node
    nnodes: Optional[int] = None  # verl 0.8's name of reward.reward_model.nnodes
    strategy: str = "fsdp"  # reward model backend: fsdp | fsdp2
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)  # reward model
    micro_batch_size: Optional[int] = None  # deprecated: SAMPLES per micro-batch over all ranks
    micro_batch_size_per_gpu: Optional[int] = None  # SAMPLES per forward per rank
    max_length: Optional[int] = None  # max tokens per scored sequence (longer ones keep their last max_length)
    use_dynamic_bsz: bool = II("critic.use_dynamic_bsz")  # token budgets instead of micro_batch_size_per_gpu
    forward_max_token_len_per_gpu: int = II("critic.forward_max_token_len_per_gpu")  # token budget per forward
    ulysses_sequence_parallel_size: int = 1  # Ulysses: ranks sharing each sample's tokens (use_remove_padding)
    # verl's newer reward loop (an RM served by an inference engine, scored by reward workers): rlcore runs the same
    # forward in its reward-model worker group, filled by tokens (forward_max_token_len_per_gpu) unless a
    # micro-batch size is given, as the engine batches (rlcore.config.reward_model_schema.uses_token_budgets).
    # True as in verl; False is verl's legacy worker path, which wants a micro-batch size or use_dynamic_bsz
    use_reward_loop: bool = True
    num_workers: Optional[int] = None  # verl 0.8's name of reward.num_workers
    # verl 0.8's name of reward.reward_model.rollout (read as that)
    rollout: RewardLoopRolloutConfig = field(default_factory=RewardLoopRolloutConfig)
    reward_manager: Optional[str] = None  # verl 0.8's name of reward.reward_manager.name (read as that)
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)  # verl 0.8's name of reward.reward_kwargs (read as that)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # verl DAPO recipe's form
    launch_reward_fn_async: bool = False  # score on the controller while the actor computes log-probs
    # rlcore additions: rule/custom scorers run isolated (rlcore.reward.isolation)
    score_workers: int = 2  # processes running compute_score; 0 = in the controller (no timeout; for debugging a scorer)
    score_timeout_s: float = 60.0  # per sample: a call still running then scores error_score
    error_score: float = 0.0  # the score of a sample whose compute_score raised or timed out
    max_error_rate: float = 0.1  # stop the run when more than this fraction of a step's samples fail
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # profiling on global_profiler.steps


@dataclass
class CustomRewardFunctionConfig:
    """A user scoring function loaded from a file (`reward.custom_reward_function.*`; verl 0.8:
    `custom_reward_function.*`)."""

    path: Optional[str] = None  # Python file; None = built-in rule scorers by data_source
    name: str = "compute_score"  # function name in that file


@dataclass
class LegacyCustomRewardFunctionConfig:
    """verl 0.8's `custom_reward_function.*`, read as reward.custom_reward_function.* (None: unset)."""

    path: Optional[str] = None  # verl 0.8's name of reward.custom_reward_function.path
    name: Optional[str] = None  # verl 0.8's name of reward.custom_reward_function.name


@dataclass
class RewardManagerModuleConfig:
    """A reward-manager class of the user's (`reward.reward_manager.module.*`, with source=importlib)."""

    path: Optional[str] = None  # Python file defining the class
    name: str = "custom_reward_manager"  # the class's name


@dataclass
class RewardManagerConfig:
    """How samples are scored (`reward.reward_manager.*`)."""

    source: str = "register"  # register (the managers by name) | importlib (a class of the user's: refused)
    name: str = "naive"  # naive | dapo (naive + DAPO's overlong punishment, set in reward_kwargs) | gdpo
    module: RewardManagerModuleConfig = field(default_factory=RewardManagerModuleConfig)  # with source=importlib


@dataclass
class RewardModelSection:
    """A reward model scoring each sample (`reward.reward_model.*`): a *ForSequenceClassification model (one label),
    run by rlcore's reward-model worker group (its knobs: `reward_model.*`); its score replaces the rule score."""

    enable: bool = False  # score with the reward model
    enable_resource_pool: bool = False  # own devices (nnodes x n_gpus_per_node) instead of the critic's / actor's
    n_gpus_per_node: int = 8  # with enable_resource_pool
    nnodes: int = 0  # with enable_resource_pool
    model_path: Optional[str] = None  # local HF *ForSequenceClassification (num_labels=1) directory
    rollout: RewardLoopRolloutConfig = field(default_factory=RewardLoopRolloutConfig)  # verl's inference engine for it


@dataclass
class RewardConfig:
    """Rewards (`reward.*`, verl 0.9; verl 0.8 spread them over reward_model.*, custom_reward_function.*)."""

    num_workers: int = 8  # verl's reward-loop workers
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)  # user scorer
    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)  # how samples are scored
    # Arguments of the reward manager; dapo: max_resp_len and overlong_buffer_cfg.{enable, len, penalty_factor,
    # log}. Empty, so new keys need Hydra's `+` (as in verl's DAPO scripts: +reward.reward_kwargs.max_resp_len=...)
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)  # a reward model's score instead


# ---------------------------------------------------------------------------------------------------- rules
# Rules for the reward tree (`reward.*`: its manager and kwargs, the reward model it enables) and the reward-model
# worker that runs that model (`reward_model.*`), and verl's worker-implementation switch. `c` is validate's checker
# (get / error / choice / at_least).

RM = "reward_model"
RR = "reward.reward_model"
_UNSUPPORTED_REWARD_MANAGER = {name: "is not supported yet by rlcore; use {key}=naive (per-sample scores; "
                                      "reward.custom_reward_function.path for your own) or {key}=dapo" for name in ("prime", "batch")}
_OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


def uses_token_budgets(rm) -> bool:
    """Whether the reward model's forwards are filled by tokens (`reward_model.forward_max_token_len_per_gpu`) rather
    than by samples (`micro_batch_size_per_gpu`): with use_dynamic_bsz, and under verl's reward loop when no
    micro-batch size is given. verl's reward loop hands the reward model to an inference engine, which batches by
    tokens and takes no micro-batch size, so its scripts set none; rlcore runs the same forward in its reward-model
    worker group and fills it the engine's way. `rm` is the reward_model section."""
    return bool(rm.use_dynamic_bsz or (rm.use_reward_loop and rm.micro_batch_size_per_gpu is None and rm.micro_batch_size is None))


def check_reward_manager(c) -> None:
    """reward.reward_manager and the reward_kwargs it takes (dapo: the overlong buffer)."""
    manager = c.cfg.reward.reward_manager
    if manager.source != "register":
        c.error(f"reward.reward_manager.source={manager.source} loads a reward-manager class of your own "
                f"(reward.reward_manager.module), which rlcore does not run; use reward.reward_manager.source=register with "
                f"reward.reward_manager.name={'/'.join(REWARD_MANAGERS)}, and put your scoring in reward.custom_reward_function")
    c.choice("reward.reward_manager.name", REWARD_MANAGERS, _UNSUPPORTED_REWARD_MANAGER)
    if manager.name not in REWARD_MANAGERS:
        return
    kwargs = c.cfg.reward.reward_kwargs or {}
    allowed = ("max_resp_len", "overlong_buffer_cfg") if manager.name == "dapo" else ()
    for key in kwargs:
        if key not in allowed:
            c.error(f"reward.reward_kwargs.{key} is not an argument of reward.reward_manager.name={manager.name}; it takes: "
                    f"{', '.join(allowed) or 'none'}")
    overlong = kwargs.get("overlong_buffer_cfg") or {}
    for key in overlong:
        if key not in _OVERLONG_KEYS:
            c.error(f"reward.reward_kwargs.overlong_buffer_cfg.{key} is unknown; valid: {', '.join(_OVERLONG_KEYS)}")
    if overlong.get("enable"):
        buffer, max_len = overlong.get("len"), kwargs.get("max_resp_len")
        if not isinstance(max_len, int) or not isinstance(buffer, int) or not 0 < buffer <= max_len:
            c.error(f"the overlong buffer needs 0 < overlong_buffer_cfg.len ({buffer}) <= max_resp_len ({max_len}); use e.g. "
                    f"+reward.reward_kwargs.max_resp_len={c.cfg.data.max_response_length} "
                    f"+reward.reward_kwargs.overlong_buffer_cfg.len={max(1, c.cfg.data.max_response_length // 4)}")
        if "penalty_factor" not in overlong:
            c.error("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor is required with enable=True; use 1.0")


def check_reward_model(c) -> None:
    c.choice("trainer.use_legacy_worker_impl", ("auto", "enable", "disable"))
    section = c.cfg.reward.reward_model
    if not section.enable:
        return
    if not section.model_path:
        c.error(f"{RR}.enable=True needs {RR}.model_path: a local HF *ForSequenceClassification (num_labels=1) directory "
                f"(verl 0.8: reward_model.model.path)")
    if c.cfg.reward_model.strategy not in ("fsdp", "fsdp2"):
        c.error(f"{RM}.strategy={c.cfg.reward_model.strategy} is not supported for the reward model (a frozen forward-only model, "
                f"which FSDP2 shards well); use {RM}.strategy=fsdp2")
    if c.cfg.trainer.use_legacy_worker_impl == "disable":
        c.error("trainer.use_legacy_worker_impl=disable selects verl's new worker implementation for the reward model, which rlcore "
                "does not have; use trainer.use_legacy_worker_impl=auto")
    max_length = c.cfg.reward_model.max_length
    if max_length is not None:
        c.at_least(f"{RM}.max_length", 2, fix=c.cfg.data.max_prompt_length + c.cfg.data.max_response_length)
    if uses_token_budgets(c.get(RM)):
        longest = max_length or c.cfg.data.max_prompt_length + c.cfg.data.max_response_length
        budget = c.cfg.reward_model.forward_max_token_len_per_gpu
        if budget < longest:
            c.error(f"{RM}.forward_max_token_len_per_gpu={budget} is smaller than the longest scored sequence ({longest} tokens: "
                    f"{RM}.max_length or data.max_prompt_length + data.max_response_length); use {RM}.forward_max_token_len_per_gpu={longest}")
    elif c.cfg.reward_model.micro_batch_size_per_gpu is None and c.cfg.reward_model.micro_batch_size is None:
        c.error(f"{RM}.micro_batch_size_per_gpu is required unless {RM}.use_dynamic_bsz=True or {RM}.use_reward_loop=True (either fills "
                f"each forward with {RM}.forward_max_token_len_per_gpu tokens); use e.g. {RM}.micro_batch_size_per_gpu=8")
    if section.enable_resource_pool:
        c.at_least(f"{RR}.nnodes", 1, fix=1)
        c.at_least(f"{RR}.n_gpus_per_node", 1, fix=c.cfg.trainer.n_gpus_per_node)
