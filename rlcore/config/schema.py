"""Typed config tree for PPO/GRPO training: one dataclass per component, the single source of every default.

Key names, meanings and defaults follow verl's config tree (shared/reference/verl_config_keys.txt), so verl command
lines compose unchanged; rlcore additions and changed defaults say so in their comment. The tree is registered with
Hydra's ConfigStore (see rlcore/config/__init__.py) so a misspelled key fails at composition.

Conventions:
- Enumerations are plain `str` fields with the allowed values in the field comment: OmegaConf structured configs
  do not support `Literal`. rlcore/config/validate.py checks every enumeration and says which value to use.
- Batch units follow verl: `data.train_batch_size` and `*ppo_mini_batch_size` count PROMPTS; `*_per_gpu` fields
  count SAMPLES (prompt x response) per data-parallel rank; `*_max_token_len_per_gpu` count tokens per rank.
- Defaults written as `II("...")` are OmegaConf interpolations copied from verl's YAML: they follow another key
  until set explicitly (e.g. rollout.prompt_length follows data.max_prompt_length).
- Dict fields (override_config, engine_kwargs.*) start empty; add keys with Hydra's `+key=value`, as in verl.

This module imports neither torch nor ray.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from rlcore.config.async_schema import AsyncTrainingConfig, RolloutPoolConfig
from rlcore.config.distill_schema import DistillationConfig
from rlcore.config.fsdp_schema import FSDPConfig, RewardModelFSDPConfig
from rlcore.config.lora_schema import MegatronLoraConfig
from rlcore.config.moe_schema import RouterReplayConfig
from rlcore.config.profiler_schema import GlobalProfilerConfig, ProfilerConfig
from rlcore.config.rollout_schema import RolloutConfig
from rlcore.config.sampler_schema import SamplerConfig


@dataclass
class DataConfig:
    """Prompt datasets (parquet in verl's row format) and the prompt batch (`data.*`)."""

    tokenizer: Optional[str] = None  # tokenizer path for the dataset; None = actor_rollout_ref.model's
    use_shm: bool = False  # copy dataset files to /dev/shm before reading
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"  # parquet path or list of paths
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"  # parquet path or list of paths
    train_max_samples: int = -1  # use only the first N training rows; -1 = all
    val_max_samples: int = -1  # use only the first N validation rows; -1 = all
    prompt_key: str = "prompt"  # column holding the prompt as chat messages
    reward_fn_key: str = "data_source"  # column that selects the rule scorer
    max_prompt_length: int = 512  # prompt tokens at most (see truncation / filter_overlong_prompts)
    max_response_length: int = 512  # generated tokens per sample at most
    train_batch_size: int = 1024  # PROMPTS per training step; samples = this x rollout.n
    # verl DAPO recipe: PROMPTS per generation batch; with algorithm.filter_groups several may fill one step
    gen_batch_size: int = II("data.train_batch_size")
    val_batch_size: Optional[int] = None  # prompts per validation batch; None = the whole validation set
    return_raw_input_ids: bool = False  # also return un-padded prompt ids (for a reward model's tokenizer)
    return_raw_chat: bool = True  # keep the chat messages in the batch (needed by chat-based rollouts)
    return_full_prompt: bool = False  # keep the templated prompt string in the batch
    shuffle: bool = True  # shuffle training prompts each epoch
    validation_shuffle: bool = False  # shuffle validation prompts
    seed: Optional[int] = None  # shuffle seed; None = trainer.seed
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # a custom order (curriculum) in place of shuffle
    dataloader_num_workers: int = 8  # DataLoader worker processes
    filter_overlong_prompts: bool = False  # drop prompts longer than max_prompt_length at load time
    skip_bad_rows: bool = False  # rlcore addition: drop rows that fail the load-time checks (counted) instead of stopping
    filter_overlong_prompts_workers: int = 1  # processes used for that filtering
    truncation: str = "error"  # overlong prompt handling: error | left | right | middle
    trust_remote_code: bool = False  # allow custom tokenizer code
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # extra chat-template arguments
    # verl tool-config YAML for the dataset's tools; follows actor_rollout_ref.rollout.multi_turn.tool_config_path
    tool_config_path: Optional[str] = II("oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path, null")
    # A vision-language policy (rlcore.data.multimodal): each row's images, one <image> in its prompt per image
    image_key: str = "images"
    video_key: str = "videos"  # rows with videos there are refused: rlcore's vision-language path takes images
    image_patch_size: int = 14  # verl's; the processor saved beside the model sets the patch size
    return_multi_modal_inputs: bool = True  # the processor's tensors travel with each row to the training forward


@dataclass
class FusedKernelOptions:
    """verl's fused log-prob kernels' options (`actor_rollout_ref.model.fused_kernel_options.*`)."""

    impl_backend: str = "torch"  # torch | triton


@dataclass
class ModelConfig:
    """The policy model shared by actor, reference and rollout (`actor_rollout_ref.model.*`)."""

    path: str = "~/models/deepseek-llm-7b-chat"  # local HF model directory (save_pretrained layout)
    hf_config_path: Optional[str] = None  # HF config to use instead of path's; None = path
    tokenizer_path: Optional[str] = None  # None = path
    use_shm: bool = False  # copy the model to /dev/shm before loading
    trust_remote_code: bool = False  # allow custom model code from the model directory
    custom_chat_template: Optional[str] = None  # Jinja chat template replacing the tokenizer's
    external_lib: Optional[str] = None  # module imported before loading (registers custom architectures)
    override_config: Dict[str, Any] = field(default_factory=dict)  # HF config fields to override
    enable_gradient_checkpointing: bool = True  # recompute activations in backward
    enable_activation_offload: bool = False  # offload checkpointed activations to CPU
    use_remove_padding: bool = True  # packed (varlen) sequences without pad tokens
    lora_rank: int = 0  # LoRA rank; 0 = full fine-tuning (peft adapters; the reference is the base, adapters off)
    lora_alpha: int = 16  # LoRA scaling numerator (scaling = lora_alpha / lora_rank)
    target_modules: Any = "all-linear"  # LoRA target modules: "all-linear" or a list of names
    exclude_modules: Any = None  # modules LoRA leaves alone: a regex or a list of names (peft's exclude_modules)
    lora_adapter_path: Optional[str] = None  # start from this saved peft adapter (its rank/alpha/targets win)
    lora: MegatronLoraConfig = field(default_factory=MegatronLoraConfig)  # LoRA with strategy=megatron (merge: both)
    use_fused_kernels: bool = False  # fused log-prob/entropy kernels
    use_liger: bool = False  # Liger kernels (verl: patches the model with them)
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)  # with use_fused_kernels


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (`*.optim.*`)."""

    optimizer: str = "AdamW"  # optimizer class name
    lr: float = 1e-6  # peak learning rate
    lr_warmup_steps: int = -1  # linear warmup steps; -1 = lr_warmup_steps_ratio x total_training_steps
    lr_warmup_steps_ratio: float = 0.0  # warmup as a fraction of total steps, in [0, 1]
    total_training_steps: int = -1  # schedule length; -1 = filled in by the trainer
    weight_decay: float = 0.01  # decoupled weight decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam betas
    clip_grad: float = 1.0  # max global grad norm
    lr_scheduler_type: str = "constant"  # after warmup: constant | cosine | linear | inverse_square_root
    min_lr_ratio: float = 0.0  # cosine and linear floor as a fraction of lr
    num_cycles: float = 0.5  # cosine cycles over the schedule (0.5 = one half-cosine decay)
    lr_decay_style: Optional[str] = None  # verl's Megatron name for lr_scheduler_type; set, it is the schedule
    warmup_style: Optional[str] = None  # verl's deprecated FSDP name for lr_scheduler_type; set, it is the schedule
    # extra optimizer arguments, as verl passes them: megatron-core OptimizerConfig fields (strategy=megatron, e.g.
    # optimizer_cpu_offload), torch.optim.AdamW keywords (FSDP2, e.g. eps, amsgrad); {} as in verl's Megatron tree, so
    # that its scripts' `+...override_optimizer_config.key=value` compose (a null would refuse them)
    override_optimizer_config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class MegatronConfig:
    """Megatron-core TP/PP layout and offloads (`<role>.megatron.*`, verl's engine/megatron.yaml), used with
    strategy=megatron (rlcore/engine/megatron). Context and expert parallelism and dist-checkpoint loading are
    refused before Ray starts."""

    param_offload: bool = False  # parameters on CPU between uses
    grad_offload: bool = False  # gradients on CPU between uses
    optimizer_offload: bool = False  # optimizer state on CPU between steps
    tensor_model_parallel_size: int = 1  # TP: each layer's matrices split over this many devices
    expert_model_parallel_size: int = 1  # EP: MoE experts split over this many devices
    expert_tensor_parallel_size: Optional[int] = None  # TP inside each expert; None = tensor_model_parallel_size
    pipeline_model_parallel_size: int = 1  # PP: layers split into this many stages
    virtual_pipeline_model_parallel_size: Optional[int] = None  # interleaved stages per device
    context_parallel_size: int = 1  # CP: each sequence split over this many devices
    sequence_parallel: bool = True  # shard norms/dropout activations over the TP group
    use_distributed_optimizer: bool = True  # shard optimizer state over data-parallel ranks (ZeRO-1)
    use_dist_checkpointing: bool = False  # load from a megatron dist checkpoint instead of HF weights (refused)
    dist_checkpointing_path: Optional[str] = None  # that checkpoint
    seed: int = 42  # megatron RNG seed
    override_ddp_config: Dict[str, Any] = field(default_factory=dict)  # megatron DDP config fields
    override_transformer_config: Dict[str, Any] = field(default_factory=lambda: {  # TransformerConfig fields
        "recompute_granularity": None, "recompute_modules": ["core_attn"], "recompute_method": None,
        "recompute_num_layers": None, "attention_backend": "flash"})
    override_mcore_model_config: Dict[str, Any] = field(default_factory=dict)  # mcore GPTModel fields (refused: rlcore derives them from HF)
    use_mbridge: bool = False  # verl: convert HF <-> megatron with mbridge; rlcore always uses its own converter
    vanilla_mbridge: bool = True  # verl: mbridge's built-in model bridges (no effect in rlcore, as use_mbridge)
    use_remove_padding: bool = True  # packed sequences (THD layout); packs only if model.use_remove_padding too
    dtype: str = "bfloat16"  # compute dtype


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


@dataclass
class ActorRolloutRefConfig:
    """Actor, rollout and reference colocated on the same devices (`actor_rollout_ref.*`)."""

    hybrid_engine: bool = True  # rollout shares the actor's devices; False: its own pool (rollout.*), async_training.*
    nccl_timeout: int = 600  # seconds before a collective times out
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy model
    actor: ActorConfig = field(default_factory=ActorConfig)  # training
    ref: RefConfig = field(default_factory=RefConfig)  # frozen reference
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # generation


@dataclass
class CriticModelConfig:
    """Value model (`critic.model.*`)."""

    path: str = "~/models/deepseek-llm-7b-chat"  # local HF model directory
    # tokenizer directory, as verl's; follows the policy's model.path (the critic reads the policy's token ids, so
    # rlcore never loads it: key_status.NO_EFFECT)
    tokenizer_path: Optional[str] = II('oc.select:actor_rollout_ref.model.path,"~/models/deepseek-llm-7b-chat"')
    override_config: Dict[str, Any] = field(default_factory=dict)  # HF config fields to override
    external_lib: Optional[str] = II("oc.select:actor_rollout_ref.model.external_lib,null")  # as the actor's
    trust_remote_code: bool = II("oc.select:actor_rollout_ref.model.trust_remote_code,false")  # as the actor's
    enable_gradient_checkpointing: bool = True  # recompute activations in backward
    use_remove_padding: bool = False  # packed (varlen) sequences
    lora_rank: int = 0  # LoRA rank; 0 = full fine-tuning (the value head then trains whole beside the adapters)
    lora_alpha: int = 16  # LoRA scaling numerator
    target_modules: Any = "all-linear"  # LoRA target modules
    lora_adapter_path: Optional[str] = None  # rlcore addition: start from this saved peft adapter
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # sharding


@dataclass
class CriticConfig:
    """Value model for GAE (`critic.*`): its own worker group, on the actor's devices unless enable_resource_pool."""

    enable: Optional[bool] = None  # None = on exactly when algorithm.adv_estimator needs it (gae)
    strategy: str = "fsdp"  # fsdp | fsdp2 | megatron
    rollout_n: int = II("oc.select:actor_rollout_ref.rollout.n,1")  # samples per prompt (as the rollout's)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)  # value model
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))  # optimizer (verl: lr 1e-5)
    ppo_mini_batch_size: int = II("oc.select:actor_rollout_ref.actor.ppo_mini_batch_size,256")  # PROMPTS
    ppo_micro_batch_size: Optional[int] = None  # deprecated: SAMPLES per micro-batch over all ranks
    ppo_micro_batch_size_per_gpu: Optional[int] = II("oc.select:.ppo_micro_batch_size,null")  # SAMPLES per rank
    forward_micro_batch_size: Optional[int] = II("oc.select:.ppo_micro_batch_size,null")  # deprecated: compute_values
    forward_micro_batch_size_per_gpu: Optional[int] = II("oc.select:.ppo_micro_batch_size_per_gpu,null")  # compute_values
    use_dynamic_bsz: bool = II("oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false")  # token budgets
    ppo_max_token_len_per_gpu: int = 32768  # token budget per micro-batch per rank
    forward_max_token_len_per_gpu: int = II(".ppo_max_token_len_per_gpu")  # token budget of compute_values
    ppo_epochs: int = II("oc.select:actor_rollout_ref.actor.ppo_epochs,1")  # passes per step
    shuffle: bool = II("oc.select:actor_rollout_ref.actor.shuffle,false")  # shuffle between mini-batches
    cliprange_value: float = 0.5  # value clip range: |V - V_old| <= this within one step
    loss_agg_mode: str = II("oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean")  # as the actor's
    grad_clip: float = 1.0  # max global grad norm
    ulysses_sequence_parallel_size: int = 1  # sequence-parallel group size
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # strategy=megatron layout
    enable_resource_pool: bool = False  # rlcore addition: own devices (nnodes x n_gpus_per_node) instead of the actor's
    n_gpus_per_node: int = II("trainer.n_gpus_per_node")  # rlcore addition: with enable_resource_pool
    nnodes: int = II("trainer.nnodes")  # rlcore addition: with enable_resource_pool
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # profiling on global_profiler.steps


@dataclass
class RewardLoopRolloutConfig:
    """verl's reward-loop engine serving the reward model (`reward_model.rollout.*`): accepted, with no effect: rlcore
    runs the reward model's forward in its reward-model worker group (reward_model.use_reward_loop)."""

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


@dataclass
class RewardModelModelConfig:
    """Model-based reward's network (`reward_model.model.*`)."""

    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"  # local HF *ForSequenceClassification (num_labels=1) directory
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
    """Reward computation: rule scorers by default, optionally a reward model (`reward_model.*`)."""

    enable: bool = False  # score with a reward model: its score replaces the rule score in training (verl)
    enable_resource_pool: bool = False  # own devices (nnodes x n_gpus_per_node) instead of the critic's / actor's
    n_gpus_per_node: int = 8  # with enable_resource_pool
    nnodes: int = 0  # with enable_resource_pool
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
    # micro-batch size is given, as the engine batches (rlcore.config.validate_reward_model.uses_token_budgets).
    # True as in verl; False is verl's legacy worker path, which wants a micro-batch size or use_dynamic_bsz
    use_reward_loop: bool = True
    num_workers: int = 1  # reward-loop workers
    rollout: RewardLoopRolloutConfig = field(default_factory=RewardLoopRolloutConfig)  # the reward loop's engine
    reward_manager: str = "naive"  # naive | dapo (naive + DAPO's overlong punishment, set in reward_kwargs)
    # Arguments of the reward manager; dapo: max_resp_len and overlong_buffer_cfg.{enable, len, penalty_factor,
    # log}. Empty, so new keys need Hydra's `+` (as in verl's DAPO scripts: +reward_model.reward_kwargs.max_resp_len=...)
    reward_kwargs: Dict[str, Any] = field(default_factory=dict)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # verl DAPO recipe's form
    launch_reward_fn_async: bool = False  # score on the controller while the actor computes log-probs
    # rlcore additions: rule/custom scorers run isolated (rlcore.reward.isolation)
    score_workers: int = 2  # processes running compute_score; 0 = in the controller (no timeout; for debugging a scorer)
    score_timeout_s: float = 60.0  # per sample: a call still running then scores error_score
    error_score: float = 0.0  # the score of a sample whose compute_score raised or timed out
    max_error_rate: float = 0.1  # stop the run when more than this fraction of a step's samples fail
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # profiling on global_profiler.steps


@dataclass
class KLControlConfig:
    """Coefficient schedule of the in-reward KL penalty (`algorithm.kl_ctrl.*`)."""

    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001  # (initial) coefficient
    horizon: int = 10000  # adaptive: steps over which the coefficient adapts
    target_kl: float = 0.1  # adaptive: KL the controller steers towards


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (`algorithm.filter_groups.*`, verl's DAPO recipe): groups whose samples all score the
    same carry no advantage signal; they are dropped and generation batches are drawn until train_batch_size
    prompts with differing scores are collected."""

    enable: bool = False  # filter groups and keep generating
    metric: Optional[str] = None  # what must differ within a group: acc | score | seq_reward | seq_final_reward
    max_num_gen_batches: int = 0  # generation batches per step at most before the run stops; <= 0 = no limit


@dataclass
class RolloutCorrectionConfig:
    """Train-inference mismatch correction (`algorithm.rollout_correction.*`, rlcore/algos/rollout_corr.py). The
    mismatch metrics (`rollout_corr/*`) are logged every step whatever these say."""

    rollout_is: Optional[str] = None  # truncated importance sampling level: token | sequence; null = off
    rollout_is_threshold: float = 2.0  # IS weights are truncated here; also the line for rollout_corr/ratio_fraction_*
    rollout_rs: Optional[str] = None  # rejection modes, comma-separated: token_k1 ... seq_max_k3; null = off
    # needed with rollout_rs: one per mode, comma-separated ("0.6_1.6,2.5"), or one for all; a *_k1 mode takes a ratio
    # band "lower_upper" or a number t for [1/t, t], a *_k2/*_k3 mode an upper bound. Any: a number or a string
    # (OmegaConf has no Union[str, float]); rlcore/config/validate_rollout_corr.py parses and checks it
    rollout_rs_threshold: Any = None
    bypass_mode: bool = False  # use the rollout's log-probs as the old log-probs (no old-log-prob pass)
    loss_type: str = "ppo_clip"  # bypass_mode loss: ppo_clip (PPO ratio to the rollout policy) | reinforce (-A w log pi)
    rollout_is_batch_normalize: bool = False  # divide the IS weights by their batch mean


@dataclass
class PFPPOConfig:
    """PF-PPO's sample weights (`algorithm.pf_ppo.*`), with use_pf_ppo."""

    reweight_method: str = "pow"  # pow | max_min | max_random
    weight_pow: float = 2.0  # pow: the weight is |score| ** weight_pow


@dataclass
class AlgorithmConfig:
    """Advantage estimation and in-reward KL (`algorithm.*`)."""

    gamma: float = 1.0  # discount factor
    lam: float = 1.0  # GAE lambda
    adv_estimator: str = "gae"  # registered estimator: gae (PPO, turns the critic on), grpo, rloo, remax, ...
    norm_adv_by_std_in_grpo: bool = True  # GRPO: divide by the group's std (False = Dr. GRPO)
    use_kl_in_reward: bool = False  # subtract a KL penalty from the reward; needs the ref model
    kl_penalty: str = "kl"  # KL estimator for the reward penalty; same choices as actor.kl_loss_type
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)  # coefficient schedule
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)  # DAPO dynamic sampling
    use_pf_ppo: bool = False  # PF-PPO: redraw the step's samples by their score after GAE (rlcore/algos/pf_ppo.py)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)  # its weighting
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # train-inference mismatch


@dataclass
class CustomRewardFunctionConfig:
    """A user scoring function loaded from a file (`custom_reward_function.*`)."""

    path: Optional[str] = None  # Python file; None = built-in rule scorers by data_source
    name: str = "compute_score"  # function name in that file


@dataclass
class CustomAlgorithmsConfig:
    """rlcore addition: user algorithms (`custom_algorithms.*`). Importing the file registers them by name, e.g.
    `@ADV_ESTIMATORS.register("my_adv")` or `@POLICY_LOSSES.register("my_loss")` from rlcore.algos."""

    path: Optional[str] = None  # Python file, loaded by the controller and every worker before use


@dataclass
class TrainerConfig:
    """Loop length, resources, validation, checkpoints and logging (`trainer.*`)."""

    balance_batch: bool = True  # reorder samples so every rank gets a similar token count
    use_legacy_worker_impl: str = "auto"  # verl: auto | enable | disable (rlcore has one worker implementation)
    total_epochs: int = 30  # passes over the training prompts (ignored when total_training_steps is set)
    total_training_steps: Optional[int] = None  # training steps; None = total_epochs x steps per epoch
    project_name: str = "verl_examples"  # tracker project
    experiment_name: str = "gsm8k"  # tracker run name
    # trackers: console|file|jsonl|tensorboard|wandb|mlflow; a list, or one name as a string (verl accepts both)
    logger: Any = field(default_factory=lambda: ["console", "wandb"])
    log_val_generations: int = 0  # validation samples printed/logged per validation
    # What a run prints. full: the doctor's plans, the rank map, a line per step, the utilisation report. short: its
    # warnings and one line at the end (held-out score last and best, reward, speed), for sweeps of many jobs.
    verbosity: str = "full"
    rollout_data_dir: Optional[str] = None  # dump training generations here as JSONL
    validation_data_dir: Optional[str] = None  # dump validation generations here as JSONL
    nnodes: int = 1  # machines
    n_gpus_per_node: int = 8  # devices per machine (ranks per node; also with device=cpu)
    save_freq: int = -1  # checkpoint every N steps; -1 = never
    resume_mode: str = "auto"  # auto (latest in default_local_dir) | disable | resume_path
    resume_from_path: Optional[str] = None  # checkpoint folder for resume_mode=resume_path
    val_before_train: bool = True  # validate once before the first step
    val_only: bool = False  # validate and exit
    test_freq: int = -1  # validate every N steps; -1 = never
    critic_warmup: int = 0  # steps that update only the critic
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"  # checkpoints
    del_local_ckpt_after_load: bool = False  # delete the local checkpoint once loaded
    max_actor_ckpt_to_keep: Optional[int] = None  # keep the newest N actor checkpoints; None = all
    max_critic_ckpt_to_keep: Optional[int] = None  # keep the newest N critic checkpoints; None = all
    device: str = "cuda"  # cuda | cpu (rlcore addition: gloo on CPU); npu not supported
    seed: int = 1  # rlcore addition: global seed (data order, sampling, init)
    # rlcore addition: memory per device (GiB) that the memory plan checks against; None = measured (CUDA: the
    # visible device; CPU: host RAM / ranks)
    device_memory_gb: Optional[float] = None
    # rlcore addition: if a worker process dies, rebuild the workers and resume from this run's last checkpoint
    # (save_freq) up to N times; 0 = fail at once like verl
    max_worker_restarts: int = 0
    # rlcore addition: a worker-group call that takes longer than this + 2 x its slowest earlier call (3 x this for
    # its first call) ends the run, naming the ranks that stopped answering
    hang_timeout_s: float = 300.0
    # rlcore addition: how long Ray may take to find room for every node's ranks (one placement group per node)
    # before the run stops, naming the nodes it has and what they lack
    placement_timeout_s: float = 120.0


@dataclass
class RayInitConfig:
    """Arguments of `ray.init` (`ray_kwargs.ray_init.*`)."""

    num_cpus: Optional[int] = None  # CPUs of a locally started cluster; None = all
    address: Optional[str] = None  # rlcore addition: running cluster to join; None = env RAY_ADDRESS or a new one


@dataclass
class RayKwargsConfig:
    """Ray settings (`ray_kwargs.*`)."""

    ray_init: RayInitConfig = field(default_factory=RayInitConfig)  # ray.init arguments
    timeline_json_file: Optional[str] = None  # write a Ray timeline (chrome trace) here


@dataclass
class PPOConfig:
    """Root of the PPO/GRPO trainer config (config/ppo_trainer.yaml composes onto this)."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    custom_algorithms: CustomAlgorithmsConfig = field(default_factory=CustomAlgorithmsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)  # with actor_rollout_ref.hybrid_engine=False
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)  # with hybrid_engine=False
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)  # what is profiled, where
    distillation: DistillationConfig = field(default_factory=DistillationConfig)  # on-policy distillation from teachers
