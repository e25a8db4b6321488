"""Typed config schema, Hydra registration and validation (importable without torch or ray).

Entry points that use `@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base="1.3")` must
call `register_configs()` first: config/ppo_trainer.yaml's defaults list starts with the structured schema
`rlcore_ppo_schema`, which lives in Hydra's ConfigStore, not on disk.
"""

import os
from pathlib import Path
from typing import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from rlcore.config.async_schema import apply_trainer_mode, derive_async_sizes
from rlcore.config.plan_table import format_plan
from rlcore.config.renamed import move_renamed
from rlcore.config.schema import PPOConfig
from rlcore.config.validate import BatchPlan, ConfigError, validate_config

# rlcore/config/__init__.py -> repository root -> config/ (present in a source checkout / editable install)
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "config")
SCHEMA_NAME = "rlcore_ppo_schema"

__all__ = [
    "CONFIG_DIR", "SCHEMA_NAME", "BatchPlan", "ConfigError", "PPOConfig",
    "compose", "finish_composition", "format_plan", "register_configs", "run_cli", "schema_registrar", "validate_config",
]


_STORED: dict[str, type] = {}  # what _store_once stored, by name


def _store_once(name: str, node: type) -> None:
    """Stores a structured schema in Hydra's ConfigStore unless it is there already. Converting the dataclass tree
    is a third of a compose (0.15 s of 0.39 s on 2 cores), and compose() registers before every call; Hydra copies
    what it loads from the store, so the stored node is never changed."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if _STORED.get(name) is node and f"{name}.yaml" in store.repo:
        return
    store.store(name=name, node=node)
    _STORED[name] = node


def register_configs() -> None:
    """Stores the structured schema in Hydra's ConfigStore under SCHEMA_NAME (safe to call repeatedly)."""
    _store_once(SCHEMA_NAME, PPOConfig)


def compose(overrides: Sequence[str] = (), config_name: str = "ppo_trainer", register: Callable[[], None] = register_configs,
            config_dir: str | None = None) -> DictConfig:
    """Composes `config/<config_name>.yaml` with Hydra command-line style overrides, for tests and tools;
    `register` stores the schema that config's defaults list names. `config_dir`: a verl example's config folder
    (`--config-path`) instead of rlcore's, whose YAML builds on verl's ppo_trainer: rlcore's config dir is put on the
    search path in its place (external_config_dir).

    The result is in struct mode: reading or setting an unknown key raises. Not for use inside a running
    `@hydra.main` app (Hydra allows one global initialization at a time)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    extra = [searchpath_override()] if config_dir else []
    with initialize_config_dir(config_dir=os.path.abspath(config_dir or CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=[*overrides, *extra])
    OmegaConf.set_struct(cfg, True)
    finish_composition(cfg, overrides)
    return cfg


def finish_composition(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """What follows Hydra's composition before anything reads the config (compose() for tests and tools, rlcore-train
    on the config Hydra hands it, with its command line's `overrides`): verl 0.8's renamed keys read as their 0.9
    names, and the RL trainer's sizes verl derives (async_training)."""
    move_renamed(cfg, overrides)
    if "async_training" in cfg:  # the RL trainer's: verl 0.9's trainer mode as split-pool keys, then their sizes
        apply_trainer_mode(cfg)
        derive_async_sizes(cfg)


# verl's scripts name its own trainer config folder (next to main_ppo) so; rlcore's CONFIG_DIR holds the same names
VERL_CONFIG_DIRS = ("config", "./config", "verl/trainer/config")


def external_config_dir(path: str | None) -> str | None:
    """A `--config-path` that is a config folder of rlcore's own (None, verl's trainer folder included, whose
    config names rlcore shares) or a verl example's folder (its absolute path)."""
    if path is None or path.rstrip("/") in VERL_CONFIG_DIRS or os.path.abspath(path) == os.path.abspath(CONFIG_DIR):
        return None
    return os.path.abspath(os.path.expanduser(path))


def searchpath_override() -> str:
    """The override that lets a verl example's YAML (`defaults: [ppo_trainer, _self_]`, with verl's config folder on
    its search path) find rlcore's ppo_trainer instead: the example's own hydra.searchpath is replaced."""
    return f"hydra.searchpath=[file://{os.path.abspath(CONFIG_DIR)}]"


def schema_registrar(name: str, node: type) -> Callable[[], None]:
    """A `register` for `compose`: stores `node` in Hydra's ConfigStore under `name` (idempotent)."""

    def register() -> None:
        _store_once(name, node)

    return register


def run_cli(run: Callable[[DictConfig, str], object], cfg: DictConfig) -> None:
    """The body of an `@hydra.main` entry point: run in Hydra's output directory; a user's config mistake prints
    every problem with its fix and exits non-zero, without a traceback."""
    from hydra.core.hydra_config import HydraConfig

    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        raise SystemExit(f"rlcore: invalid configuration\n{err}") from None
