"""`python -m rlcore.train_rm key=value ...` / `rlcore-rm`: reward-model training on preference pairs.

The config (config/rm_trainer.yaml, schema rlcore/config/rm_schema.py) is checked and the pairs tokenized before
Ray starts; then a worker group (FSDP2, one process per device) trains a scalar head on the model's trunk with the
Bradley-Terry loss, validates pair accuracy, and exports an HF *ForSequenceClassification.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rlcore.config import CONFIG_DIR, compose, run_cli, schema_registrar
from rlcore.config.files import file_list
from rlcore.config.rm_schema import RMTrainerConfig, rm_config_errors

SCHEMA_NAME = "rlcore_rm_schema"
CONSOLE_KEYS = ("train/loss", "train/accuracy", "train/margin", "train/grad_norm", "val/loss", "val/accuracy", "val/margin")


register = schema_registrar(SCHEMA_NAME, RMTrainerConfig)
register()


def compose_rm(overrides=(), config_name: str = "rm_trainer") -> DictConfig:
    """config/<config_name>.yaml with command-line style overrides (tests and tools)."""
    return compose(overrides, config_name, register)


def load_pairs(cfg: DictConfig, tokenizer):
    from rlcore.data.pairs import read_pairs

    d = cfg.data
    read = lambda files: read_pairs(file_list(files), tokenizer, d.prompt_key, d.chosen_key, d.rejected_key, d.margin_key,  # noqa: E731
                                    d.max_length, d.truncation)
    return read(d.train_files), (read(d.val_files) if d.val_files else None)


def run(cfg: DictConfig, run_dir: str) -> dict[str, float]:
    """Trains; returns the last step's metrics (with `checkpoint`: the HF export). Cleans up Ray on any exit."""
    from rlcore.trainer.supervised import run_supervised
    from rlcore.workers.reward_trainer import RewardTrainerWorker

    return run_supervised(cfg, run_dir, "rm", RewardTrainerWorker, load_pairs, rm_config_errors(cfg), CONSOLE_KEYS)


@hydra.main(config_path=CONFIG_DIR, config_name="rm_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    run_cli(run, cfg)


if __name__ == "__main__":
    main()
