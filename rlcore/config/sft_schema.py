"""Typed schema of supervised fine-tuning (`python -m rlcore.train_sft`, config/sft_trainer.yaml), with verl's SFT
keys where they exist: `data.prompt_key`, `data.response_key`, `data.max_length`, `data.truncation`,
`data.train_batch_size`, `data.micro_batch_size_per_gpu`, `model.partial_pretrain`, `model.lora_rank`, `optim.lr`,
`trainer.total_epochs`, ... Sizes count samples (prompt + response rows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from rlcore.config.actor_schema import CheckpointConfig
from rlcore.config.fsdp_schema import FSDPConfig, following
from rlcore.config.optim_schema import OptimConfig
from rlcore.config.rm_schema import RMModelConfig, RMTrainerSection
from rlcore.config.schema import RayKwargsConfig

TRUNCATIONS = ("error", "left", "right")  # data.truncation of SFT rows
PAD_MODES = ("no_padding", "right", "left_right")  # verl's data.pad_mode (its SFT collators)


@dataclass
class SFTMultiTurnConfig:
    """verl's multi-turn SFT (`data.multiturn.*`): each row a conversation; the loss covers the assistant's turns."""

    enable: bool = False  # rows are conversations (the prompt_key / response_key columns are not read)
    messages_key: str = "messages"  # column of the chat messages
    tools_key: str = "tools"  # column of the tool schemas handed to the chat template (when the row has it)
    enable_thinking_key: str = "enable_thinking"  # column of the template's enable_thinking flag (when the row has it)


@dataclass
class SFTDataConfig:
    """Prompt/response rows (`data.*`): the prompt as chat messages (or a plain string: one user turn)."""

    train_files: Any = field(default_factory=lambda: ["~/data/gsm8k/train.parquet"])  # parquet path or list of paths
    val_files: Any = field(default_factory=lambda: ["~/data/gsm8k/test.parquet"])  # held-out rows: path or list
    prompt_key: str = "prompt"  # column of the prompt
    response_key: str = "response"  # column of the target answer (text; EOS is appended)
    # the prompt column holds a dict (e.g. extra_info): the prompt is value[k1][k2]... for these keys; None = the value
    prompt_dict_keys: Optional[List[str]] = None
    response_dict_keys: Optional[List[str]] = None  # the same for the response column
    multiturn: SFTMultiTurnConfig = field(default_factory=SFTMultiTurnConfig)  # conversations instead of prompt/response
    image_key: str = "images"  # a vision-language model's rows: each row's images (one <image> per image in the prompt)
    max_length: int = 1024  # prompt + response tokens
    truncation: str = "error"  # error | left (drop the prompt's start) | right (drop the response's end)
    train_batch_size: int = 256  # samples per optimizer step, over all ranks
    micro_batch_size: Optional[int] = None  # verl's deprecated global form, which its SFT trainer reads nowhere
    micro_batch_size_per_gpu: int = 4  # samples per micro-batch per rank
    use_dynamic_bsz: bool = False  # rlcore addition: token-budget micro-batches
    max_token_len_per_gpu: int = 16384  # token budget per micro-batch per rank
    val_max_rows: Optional[int] = None  # validate on at most this many rows; None = all
    # verl 0.9's SFT trainer (sft_trainer) reads only conversations: set, every row is one, in this column (verl's
    # default `messages`); None = prompt/response rows (verl's older fsdp_sft_trainer) unless multiturn.enable
    messages_key: Optional[str] = None
    tools_key: str = "tools"  # with messages_key: column of the tool schemas handed to the chat template
    enable_thinking_key: str = "enable_thinking"  # with messages_key: column of the template's enable_thinking flag
    # with messages_key: enable_thinking for rows without that column; None = the template's own default
    enable_thinking_default: Optional[bool] = None
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # extra chat-template arguments, every row
    train_max_samples: int = -1  # train on the first N rows only; -1 = all
    val_max_samples: int = -1  # validate on the first N rows only; -1 = all
    ignore_input_ids_mismatch: bool = False  # verl's per-turn tokenization check (no effect: key_status.py)
    num_workers: int = 8  # verl's DataLoader worker processes (no effect: key_status.py)
    use_shm: bool = False  # copy the data files to /dev/shm first (no effect: key_status.py)
    balance_dp_token: bool = False  # verl: balance tokens over data-parallel ranks ("to be implemented" there too)
    shuffle: bool = True  # reshuffle every epoch
    seed: Optional[int] = None  # shuffle seed; None = trainer.seed
    pad_mode: str = "no_padding"  # verl's collator layout: no_padding | right | left_right (use_remove_padding packs)


def conversation_columns(data) -> Optional[SFTMultiTurnConfig]:
    """Where a conversation row's messages, tools and thinking flag are (verl 0.9's data.messages_key and its
    siblings, or verl 0.8's data.multiturn section when enabled); None for prompt/response rows."""
    if data.messages_key is not None:
        return SFTMultiTurnConfig(True, data.messages_key, data.tools_key, data.enable_thinking_key)
    return data.multiturn if data.multiturn.enable else None


@dataclass
class SFTModelConfig(RMModelConfig):
    """The model (`model.*`): verl's `model.partial_pretrain` names it; `path` follows it."""

    partial_pretrain: str = "~/models/Qwen2.5-0.5B-Instruct"  # local HF causal LM directory
    path: str = II("model.partial_pretrain")  # the model directory rlcore loads; follows partial_pretrain
    use_remove_padding: bool = II("use_remove_padding")  # pack the micro-batch's sequences; follows the top-level key
    # Ulysses: ranks sharing each sample's tokens (packed sequences only); follows the top-level key
    ulysses_sequence_parallel_size: int = II("ulysses_sequence_parallel_size")
    use_liger: bool = False  # Liger kernels (verl's SFT trainer: patches the model with them)
    strategy: str = II("engine.strategy")  # fsdp | fsdp2 (both FSDP2 in rlcore); follows engine.strategy
    use_torch_compile: bool = II("engine.use_torch_compile")  # compile the log-prob head's kernels; follows the engine's
    fsdp_config: FSDPConfig = field(default_factory=lambda: following("engine"))  # sharding; each field follows engine.*


@dataclass
class SFTEngineConfig(FSDPConfig):
    """verl's newer SFT trainer's engine section (`engine.*`, engine/fsdp.yaml, picked by `engine=fsdp`): the FSDP
    knobs that model.fsdp_config follows (verl's older fsdp_sft_trainer sets them there), and the engine's own."""

    seed: int = II("trainer.seed")  # the workers' torch seed (LoRA init); rlcore: follows trainer.seed (verl: 42)
    full_determinism: bool = False  # deterministic torch kernels (torch.use_deterministic_algorithms)
    use_torch_compile: bool = True  # compile the log-prob head's per-chunk kernels
    entropy_from_logits_with_chunking: bool = False  # verl's entropy memory switch (SFT computes no entropy)
    entropy_checkpointing: bool = False  # verl's entropy memory switch (SFT computes no entropy)
    forward_only: bool = False  # verl's inference-only engine (its reference and reward roles); SFT trains


@dataclass
class SFTTrainerConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    engine: SFTEngineConfig = field(default_factory=SFTEngineConfig)  # verl's newer SFT trainer's engine section
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # what a checkpoint saves and a resume loads
    trainer: RMTrainerSection = field(default_factory=lambda: RMTrainerSection(project_name="rlcore_sft", experiment_name="sft"))
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    # verl's fsdp_sft_trainer keeps these keys at the top (its use_remove_padding defaults to False; rlcore packs by
    # default: exact and faster)
    use_remove_padding: bool = True
    # Ulysses sequence parallelism (verl's fsdp_sft_trainer key); follows engine.ulysses_sequence_parallel_size
    ulysses_sequence_parallel_size: int = II("engine.ulysses_sequence_parallel_size")
