"""`python -m rlcore.train_sft key=value ...` / `rlcore-sft`: supervised fine-tuning on prompt/response rows.

verl's SFT keys (config/sft_trainer.yaml, schema rlcore/config/sft_schema.py); the loss is the token-mean NLL of
the response tokens; sequences are packed by default (model.use_remove_padding); FSDP2 on a worker group driven
by one controller, LoRA with model.lora_rank; the result is saved as an HF causal LM (+ a peft adapter with LoRA).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from rlcore.config import CONFIG_DIR, compose, run_cli, schema_registrar
from rlcore.config.files import file_list
from rlcore.config.fsdp_schema import checkpoint_contents_errors
from rlcore.config.rm_schema import supervised_config_errors
from rlcore.config.sft_schema import PAD_MODES, TRUNCATIONS, SFTTrainerConfig

SCHEMA_NAME = "rlcore_sft_schema"
CONSOLE_KEYS = ("train/loss", "train/grad_norm", "train/lr", "val/loss")


register = schema_registrar(SCHEMA_NAME, SFTTrainerConfig)
register()


def compose_sft(overrides=(), config_name: str = "sft_trainer") -> DictConfig:
    """config/<config_name>.yaml with command-line style overrides (tests and tools)."""
    return compose(overrides, config_name, register)


def sft_config_errors(cfg: DictConfig) -> list[str]:
    errors = supervised_config_errors(cfg, "samples", "SFT")
    if cfg.data.truncation not in TRUNCATIONS:
        errors.append(f"data.truncation={cfg.data.truncation} is not one of {', '.join(TRUNCATIONS)}; use data.truncation=error")
    if cfg.data.pad_mode not in PAD_MODES:
        errors.append(f"data.pad_mode={cfg.data.pad_mode} is not one of {', '.join(PAD_MODES)}; use data.pad_mode=no_padding")
    if cfg.engine.forward_only:
        errors.append("engine.forward_only=True builds verl's inference-only engine, which cannot train; drop it for SFT")
    return errors + checkpoint_contents_errors(lambda key: OmegaConf.select(cfg, key), "checkpoint", "trainer.resume_mode")


def load_rows(cfg: DictConfig, tokenizer):
    from rlcore.config.sft_schema import conversation_columns
    from rlcore.data.sft_rows import TemplateArgs, read_sft
    from rlcore.models.vision import vision_processor

    d = cfg.data
    processor = vision_processor(cfg.model.path)  # None: a text-only model
    template = TemplateArgs(dict(d.apply_chat_template_kwargs or {}), d.enable_thinking_default)

    def read(files, max_rows: int):
        return read_sft(file_list(files), tokenizer, d.prompt_key, d.response_key, d.max_length, d.truncation,
                        d.prompt_dict_keys or [], d.response_dict_keys or [], conversation_columns(d), processor, d.image_key,
                        template, max_rows if max_rows >= 0 else None)

    return read(d.train_files, d.train_max_samples), (read(d.val_files, d.val_max_samples) if d.val_files else None)


def run(cfg: DictConfig, run_dir: str) -> dict[str, float]:
    """Trains; returns the last step's metrics (with `checkpoint`: the HF export). Cleans up Ray on any exit."""
    from rlcore.trainer.supervised import run_supervised
    from rlcore.workers.sft_trainer import SFTTrainerWorker

    return run_supervised(cfg, run_dir, "sft", SFTTrainerWorker, load_rows, sft_config_errors(cfg), CONSOLE_KEYS)


@hydra.main(config_path=CONFIG_DIR, config_name="sft_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    run_cli(run, cfg)


if __name__ == "__main__":
    main()
