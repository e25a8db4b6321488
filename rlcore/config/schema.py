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
from typing import Any, Dict, Optional

from omegaconf import II

from rlcore.config.actor_schema import ActorConfig, CheckpointConfig, RefConfig
from rlcore.config.algorithm_schema import AlgorithmConfig
from rlcore.config.async_schema import AsyncTrainingConfig, RolloutPoolConfig, TrainerV1Config
from rlcore.config.distill_schema import DistillationConfig
from rlcore.config.fsdp_schema import FSDPConfig
from rlcore.config.lora_schema import MegatronLoraConfig
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.config.optim_schema import OptimConfig
from rlcore.config.profiler_schema import GlobalProfilerConfig, ProfilerConfig
from rlcore.config.reward_model_schema import LegacyCustomRewardFunctionConfig, RewardConfig, RewardModelConfig
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
    mm_processor_kwargs: Dict[str, Any] = field(default_factory=dict)  # verl 0.9: extra arguments of the processor's call
    audio_key: str = "audios"  # verl 0.9: the rows' audio column (rows with audio there are refused)
    # verl 0.9: a Python file of plain functions the rows' tools come from; follows the rollout's
    function_tool_path: Optional[str] = II("oc.select:actor_rollout_ref.rollout.multi_turn.function_tool_path, null")


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
    # tokenizer directory, as verl's (the critic reads the policy's token ids, so rlcore never loads it:
    # key_status.NO_EFFECT)
    tokenizer_path: Optional[str] = None
    override_config: Dict[str, Any] = field(default_factory=dict)  # HF config fields to override
    external_lib: Optional[str] = None  # module imported before loading (verl 0.9: the critic's own, not the actor's)
    trust_remote_code: bool = False  # allow custom model code (verl 0.9: the critic's own, not the actor's)
    enable_gradient_checkpointing: bool = True  # recompute activations in backward
    use_remove_padding: bool = True  # packed (varlen) sequences (verl 0.9's default)
    lora_rank: int = 0  # LoRA rank; 0 = full fine-tuning (the value head then trains whole beside the adapters)
    lora_alpha: int = 16  # LoRA scaling numerator
    target_modules: Any = "all-linear"  # LoRA target modules
    lora_adapter_path: Optional[str] = None  # start from this saved peft adapter
    exclude_modules: Any = None  # modules LoRA leaves alone: a regex or a list of names (peft's exclude_modules)
    hf_config_path: Optional[str] = None  # HF config to use instead of path's; None = path
    use_shm: bool = False  # copy the model to /dev/shm before loading
    custom_chat_template: Optional[str] = None  # verl 0.9's key; the critic reads the policy's token ids
    enable_activation_offload: bool = False  # offload checkpointed activations to host memory (the policy's only)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # verl 0.8's place of critic.fsdp (read as that)


@dataclass
class CriticConfig:
    """Value model for GAE (`critic.*`): its own worker group, on the actor's devices unless enable_resource_pool."""

    enable: Optional[bool] = None  # None = on exactly when algorithm.adv_estimator needs it (gae)
    strategy: str = "fsdp"  # fsdp | fsdp2 | megatron
    rollout_n: int = II("oc.select:actor_rollout_ref.rollout.n,1")  # samples per prompt (as the rollout's)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)  # value model
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # sharding (verl 0.9; 0.8's critic.model.fsdp_config)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # what the critic's checkpoint holds (verl 0.9)
    data_loader_seed: int = 42  # verl 0.9: the seed of the mini-batch shuffle (critic.shuffle)
    # verl 0.9: seq-mean-token-sum-norm divides each sequence's token sum by this; None = the response length
    loss_scale_factor: Optional[int] = II("oc.select:actor_rollout_ref.actor.loss_scale_factor,null")
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
    use_v1: bool = True  # verl 0.9: its v1 trainer (rlcore has one loop for verl's trainers)
    v1: TrainerV1Config = field(default_factory=TrainerV1Config)  # verl 0.9's trainer modes (sync | separate_async)
    default_hdfs_dir: Optional[str] = None  # verl: copy checkpoints to this HDFS directory too (refused: no HDFS client)
    esi_redundant_time: int = 0  # verl: seconds kept before a cloud instance's expiry to save a checkpoint
    ray_wait_register_center_timeout: int = 300  # verl: seconds to wait for its worker register center


@dataclass
class RuntimeEnvConfig:
    """Ray's runtime environment of the run's worker processes (`ray_kwargs.ray_init.runtime_env.*`, verl 0.9): given
    to `ray.init` when rlcore starts the cluster and to every worker group's actors, so it holds on a joined cluster
    too. verl 0.9's launch scripts run their workers through uv this way."""

    # The command that starts each worker's Python (Ray's py_executable), e.g. `uv run --frozen --extra vllm`;
    # None = the controller's interpreter
    py_executable: Optional[str] = None
    env_vars: Dict[str, str] = field(default_factory=dict)  # environment variables of every worker process


@dataclass
class RayInitConfig:
    """Arguments of `ray.init` (`ray_kwargs.ray_init.*`)."""

    num_cpus: Optional[int] = None  # CPUs of a locally started cluster; None = all
    address: Optional[str] = None  # rlcore addition: running cluster to join; None = env RAY_ADDRESS or a new one
    runtime_env: RuntimeEnvConfig = field(default_factory=RuntimeEnvConfig)  # the workers' environment (verl 0.9)


@dataclass
class RayKwargsConfig:
    """Ray settings (`ray_kwargs.*`)."""

    ray_init: RayInitConfig = field(default_factory=RayInitConfig)  # ray.init arguments
    timeline_json_file: Optional[str] = None  # write a Ray timeline (chrome trace) here


@dataclass
class PPOConfig:
    """Root of the PPO/GRPO trainer config (config/ppo_trainer.yaml composes onto this)."""

    # verl 0.9's training-engine group (config/model_engine/): dp (FSDP2) | megatron (sets the actor's, reference's
    # and critic's strategy); torchtitan and veomni are refused
    model_engine: str = "dp"
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)  # verl 0.9's reward tree
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)  # the reward model's worker (and 0.8's names)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    # verl 0.8's name of reward.custom_reward_function (read as that)
    custom_reward_function: LegacyCustomRewardFunctionConfig = field(default_factory=LegacyCustomRewardFunctionConfig)
    custom_algorithms: CustomAlgorithmsConfig = field(default_factory=CustomAlgorithmsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)  # with actor_rollout_ref.hybrid_engine=False
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)  # with hybrid_engine=False
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)  # what is profiled, where
    distillation: DistillationConfig = field(default_factory=DistillationConfig)  # on-policy distillation from teachers
