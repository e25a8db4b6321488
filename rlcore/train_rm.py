"""`python -m rlcore.train_rm key=value ...` / `rlcore-rm`: reward-model training on preference pairs.

The config (config/rm_trainer.yaml, schema rlcore/config/rm_schema.py) is checked and the pairs tokenized before
Ray starts; then a worker group (FSDP2, one process per device) trains a scalar head on the model's trunk with the
Bradley-Terry loss, validates pair accuracy, and exports an HF *ForSequenceClassification.
"""

from __future__ import annotations

import os
import shutil

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlcore.config import CONFIG_DIR, ConfigError
from rlcore.config.rm_schema import RMTrainerConfig, rm_config_errors

SCHEMA_NAME = "rlcore_rm_schema"
CONSOLE_KEYS = ("train/loss", "train/accuracy", "train/margin", "train/grad_norm", "val/loss", "val/accuracy", "val/margin")


def register_rm_config() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RMTrainerConfig)


register_rm_config()


def compose_rm(overrides=(), config_name: str = "rm_trainer") -> DictConfig:
    """config/<config_name>.yaml with command-line style overrides (tests and tools)."""
    from hydra import compose, initialize_config_dir

    register_rm_config()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    OmegaConf.set_struct(cfg, True)
    return cfg


def load_pairs(cfg: DictConfig, tokenizer):
    from rlcore.data.pairs import read_pairs

    d = cfg.data
    read = lambda files: read_pairs(list(files), tokenizer, d.prompt_key, d.chosen_key, d.rejected_key, d.margin_key,  # noqa: E731
                                    d.max_length, d.truncation)
    return read(d.train_files), (read(d.val_files) if d.val_files else None)


def run(cfg: DictConfig, run_dir: str) -> dict[str, float]:
    """Trains; returns the last step's metrics (with `checkpoint`: the HF export). Cleans up Ray on any exit."""
    from transformers import AutoTokenizer

    from rlcore.models.hf import resolve_model_path

    errors = rm_config_errors(cfg)
    try:
        cfg.model.path = resolve_model_path(cfg.model.path, "model.path")
    except FileNotFoundError as err:
        errors.append(str(err))
    if errors:
        raise ConfigError(errors)
    cfg.trainer.default_local_dir = os.path.abspath(os.path.expanduser(cfg.trainer.default_local_dir))
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path, local_files_only=True)
    train, val = load_pairs(cfg, tokenizer)  # tokenized (and length-checked) before any process starts
    steps_per_epoch = len(train) // cfg.data.train_batch_size
    if steps_per_epoch == 0:
        raise ConfigError([f"data.train_batch_size={cfg.data.train_batch_size} pairs is more than the {len(train)} training pairs"])
    total_steps = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * steps_per_epoch
    print(f"reward model: {len(train)} training pairs, {len(val) if val else 0} validation pairs, {total_steps} steps of "
          f"{cfg.data.train_batch_size} pairs", flush=True)

    import ray
    import torch

    from rlcore.controller.ray_group import RayWorkerGroup, ResourcePool, init_ray
    from rlcore.trainer.rm import RewardModelTrainer
    from rlcore.trainer.tracking import Tracker
    from rlcore.workers.reward_trainer import RewardTrainerWorker

    torch.set_num_threads(1)
    tracker = Tracker(list(cfg.trainer.logger), run_dir, total_steps, console_keys=CONSOLE_KEYS)
    started_ray = init_ray(cfg.ray_kwargs.ray_init.address, cfg.ray_kwargs.ray_init.num_cpus)
    pool, group = None, None
    try:
        t = cfg.trainer
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // (t.nnodes * t.n_gpus_per_node)) if t.device == "cpu" else 1
        pool = ResourcePool(t.nnodes, t.n_gpus_per_node, t.device, cpus_per_rank=cpus)
        group = RayWorkerGroup(RewardTrainerWorker, pool, config=OmegaConf.to_container(cfg, resolve=True))
        group.init_model(total_steps)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        final = RewardModelTrainer(cfg, group, train, val, pad, tracker, total_steps).fit()
        tokenizer.save_pretrained(final["checkpoint"])
        if cfg.trainer.export_dir:
            export = os.path.abspath(os.path.expanduser(cfg.trainer.export_dir))
            shutil.rmtree(export, ignore_errors=True)
            shutil.copytree(final["checkpoint"], export)
            final["checkpoint"] = export
        print(f"reward model saved to {final['checkpoint']}", flush=True)
        return final
    finally:
        tracker.close()
        if group is not None:
            group.kill(graceful=True)
        if pool is not None:
            pool.release()
        if started_ray:
            ray.shutdown()


@hydra.main(config_path=CONFIG_DIR, config_name="rm_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        raise SystemExit(f"rlcore: invalid configuration\n{err}") from None


if __name__ == "__main__":
    main()
