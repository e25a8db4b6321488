"""Typed schema of reward-model training (`python -m rlcore.train_rm`, config/rm_trainer.yaml).

Keys follow verl's SFT trainer where one exists (`data.train_files`, `data.prompt_key`, `data.max_length`,
`data.truncation`, `data.micro_batch_size_per_gpu`, `model.partial_pretrain` -> here `model.path`, `model.lora_rank`,
`optim.lr`, `trainer.total_epochs`, ...); the pair columns (`chosen_key`, `rejected_key`, `margin_key`) are
rlcore's. Sizes count PAIRS (each is two sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from rlcore.config.fsdp_schema import FSDPConfig, supervised_engine_errors
from rlcore.config.keys import unknown_key_errors
from rlcore.config.optim_schema import OptimConfig
from rlcore.config.schema import RayKwargsConfig


@dataclass
class RMDataConfig:
    """Preference pairs (`data.*`): parquet rows of chat-message prompt, chosen and rejected answers."""

    train_files: Any = field(default_factory=lambda: ["~/data/rm/train.parquet"])  # parquet path or list of paths
    val_files: Any = field(default_factory=lambda: ["~/data/rm/test.parquet"])  # held-out pairs: path or list
    prompt_key: str = "prompt"  # column of chat messages
    chosen_key: str = "chosen"  # column of the preferred answer (text)
    rejected_key: str = "rejected"  # column of the other answer (text)
    margin_key: Optional[str] = None  # optional column: loss -log sigmoid(r_c - r_r - margin)
    max_length: int = 1024  # tokens per sequence (prompt + answer, chat template included)
    truncation: str = "error"  # error | left (keep the last max_length tokens; the score is read at the last)
    train_batch_size: int = 256  # PAIRS per optimizer step, over all ranks
    micro_batch_size_per_gpu: int = 4  # PAIRS per micro-batch per rank
    use_dynamic_bsz: bool = False  # token-budget micro-batches instead of micro_batch_size_per_gpu
    max_token_len_per_gpu: int = 16384  # token budget per micro-batch per rank (both sequences of each pair)
    val_max_rows: Optional[int] = None  # validate on at most this many pairs; None = all
    shuffle: bool = True  # reshuffle the pairs every epoch
    seed: Optional[int] = None  # shuffle seed; None = trainer.seed


@dataclass
class RMModelConfig:
    """The reward model (`model.*`): an HF causal LM (or reward model) trunk with a scalar head `score`."""

    path: str = "~/models/Meta-Llama-3-8B-Instruct"  # local HF model directory (trunk; a reward model's head is kept)
    tokenizer_path: Optional[str] = None  # None = path
    override_config: Dict[str, Any] = field(default_factory=dict)  # HF config fields to override
    trust_remote_code: bool = False  # allow custom model and tokenizer code from the model directory
    strategy: str = "fsdp2"  # training backend (fsdp | fsdp2)
    enable_gradient_checkpointing: bool = False  # recompute activations in backward
    use_remove_padding: bool = False  # packed (varlen) sequences
    lora_rank: int = 0  # LoRA rank; 0 = full fine-tuning (the head always trains whole)
    lora_alpha: int = 16  # LoRA scaling numerator
    target_modules: Any = "all-linear"  # LoRA target modules
    lora_adapter_path: Optional[str] = None  # start from a saved peft adapter
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # sharding, precision, offload


@dataclass
class RMTrainerSection:
    """Loop, resources and outputs (`trainer.*`)."""

    total_epochs: int = 1  # passes over the training pairs
    total_training_steps: Optional[int] = None  # optimizer steps; None = total_epochs x steps per epoch
    project_name: str = "rlcore_rm"  # tracker project
    experiment_name: str = "reward_model"  # tracker run name
    logger: Any = field(default_factory=lambda: ["console"])  # trackers (console|file|jsonl|...): a list or one name
    nnodes: int = 1  # machines
    n_gpus_per_node: int = 8  # ranks per machine (also with device=cpu)
    device: str = "cuda"  # cuda | cpu (gloo)
    device_memory_gb: Optional[float] = None  # rlcore-plan: GiB per device to plan for (None: the local GPU, or 80)
    test_freq: int = -1  # validate every N steps (and after the last); -1 = only after the last
    save_freq: int = -1  # checkpoint every N steps; -1 = only the final HF export
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"  # outputs
    export_dir: Optional[str] = None  # also copy the final HF reward model here (a stable reward.reward_model.model_path)
    seed: int = 1  # init and shuffle seed
    resume_mode: str = "auto"  # auto (the latest checkpoint in default_local_dir) | disable | resume_path
    resume_from_path: Optional[str] = None  # a global_step_N folder, for resume_mode=resume_path
    max_ckpt_to_keep: Optional[int] = None  # keep the newest N checkpoint steps; None = all
    hang_timeout_s: float = 300.0  # a call slower than this + 2 x its slowest earlier call names the stuck ranks
    placement_timeout_s: float = 120.0  # seconds Ray may take to place every node's ranks before the run stops
    # rlcore addition (Lightning's EarlyStopping stopping_threshold): end training at the first validation (every
    # test_freq steps) where stop_metric reaches stop_threshold, e.g. val/exact_match (SFT) or val/accuracy (RM);
    # the final checkpoint is that step's. None = never.
    stop_metric: Optional[str] = None
    stop_threshold: float = 0.0  # the value stop_metric must reach (see stop_mode)
    stop_mode: str = "max"  # max: stop once the metric is >= stop_threshold; min: once it is <=


@dataclass
class RMTrainerConfig:
    data: RMDataConfig = field(default_factory=RMDataConfig)
    model: RMModelConfig = field(default_factory=RMModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    trainer: RMTrainerSection = field(default_factory=RMTrainerSection)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)


def rm_config_errors(cfg) -> list[str]:
    """Batch arithmetic and choices of reward-model training, each with its fix (reported together, before Ray)."""
    errors = supervised_config_errors(cfg, "pairs", "reward-model training", sequences_per_row=2)
    if cfg.data.truncation not in ("error", "left"):
        errors.insert(int(cfg.model.strategy not in ("fsdp", "fsdp2")),
                      f"data.truncation={cfg.data.truncation}: a reward model reads its score at the last token, so only error or "
                      "left (keep the last max_length tokens) make sense; use data.truncation=left")
    return errors


def stop_rule_met(trainer_cfg, metrics: dict[str, float]) -> bool:
    """trainer.stop_metric has reached trainer.stop_threshold in these (validation) metrics."""
    if trainer_cfg.stop_metric is None or trainer_cfg.stop_metric not in metrics:
        return False
    value = metrics[trainer_cfg.stop_metric]
    return value >= trainer_cfg.stop_threshold if trainer_cfg.stop_mode == "max" else value <= trainer_cfg.stop_threshold


def supervised_config_errors(cfg, unit: str, what: str, sequences_per_row: int = 1) -> list[str]:
    """The rules reward-model training and SFT share: backend, batch arithmetic over ranks, token budgets, LoRA."""
    # a `+data.bogus_key=1` composes into the typed tree: refused as the PPO trainer's validation refuses it
    errors, d = unknown_key_errors(cfg) + supervised_engine_errors(lambda key: OmegaConf.select(cfg, key)), cfg.data
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    # SFT's Ulysses ranks share each sample: the batch splits over data-parallel replicas, world / sp of them
    sp = OmegaConf.select(cfg, "model.ulysses_sequence_parallel_size", default=1)
    dp = world // sp if sp > 0 and world % sp == 0 else world
    if sp < 1 or world % sp:
        errors.append(f"ulysses_sequence_parallel_size={sp} must divide the {world} ranks (trainer.nnodes x trainer.n_gpus_per_node)")
    elif sp > 1 and not cfg.model.use_remove_padding:
        errors.append(f"ulysses_sequence_parallel_size={sp} splits packed sequences; set use_remove_padding=true")
    if cfg.model.strategy not in ("fsdp", "fsdp2"):
        errors.append(f"model.strategy={cfg.model.strategy} is not supported for {what}; use model.strategy=fsdp2")
    if d.train_batch_size < dp or d.train_batch_size % dp:
        fix = max(dp, d.train_batch_size // dp * dp)
        errors.append(f"data.train_batch_size={d.train_batch_size} {unit} is not divisible by {dp} data-parallel ranks "
                      f"(trainer.nnodes x trainer.n_gpus_per_node / Ulysses size): each rank takes whole {unit}; use "
                      f"data.train_batch_size={fix}")
    elif not d.use_dynamic_bsz and (d.train_batch_size // dp) % d.micro_batch_size_per_gpu:
        errors.append(f"data.micro_batch_size_per_gpu={d.micro_batch_size_per_gpu} {unit} does not divide the {d.train_batch_size // dp} "
                      f"{unit} per data-parallel rank per step; use a divisor, or data.use_dynamic_bsz=True")
    need = sequences_per_row * d.max_length
    if d.use_dynamic_bsz and d.max_token_len_per_gpu < need:
        errors.append(f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} cannot hold one {unit[:-1]} of data.max_length={d.max_length} "
                      f"tokens; use data.max_token_len_per_gpu={need}")
    if cfg.model.lora_rank < 0 or cfg.model.lora_rank > 0 and cfg.model.lora_alpha <= 0:
        errors.append(f"model.lora_rank={cfg.model.lora_rank} / lora_alpha={cfg.model.lora_alpha}: rank must be >= 0 and alpha > 0")
    if cfg.trainer.resume_mode not in ("auto", "disable", "resume_path"):
        errors.append(f"trainer.resume_mode={cfg.trainer.resume_mode} is not one of auto, disable, resume_path")
    elif cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path (a folder such as "
                      "<trainer.default_local_dir>/global_step_100); set it or use trainer.resume_mode=auto")
    t = cfg.trainer
    if t.stop_mode not in ("max", "min"):
        errors.append(f"trainer.stop_mode={t.stop_mode} is not max (stop once the metric is >= trainer.stop_threshold) or min (<=)")
    if t.stop_metric is not None and (not t.stop_metric.startswith("val/") or not d.val_files or t.test_freq <= 0):
        errors.append(f"trainer.stop_metric={t.stop_metric} is checked at validation: it needs a val/ metric, data.val_files and "
                      "trainer.test_freq > 0 (how often to validate)")
    return errors
