"""verl 0.8's names of the keys verl 0.9 renamed: both dialects compose, and a run reads 0.9's.

verl 0.9 moved the reward settings under `reward.*` (`reward_model.reward_manager` -> `reward.reward_manager.name`,
`custom_reward_function.*` -> `reward.custom_reward_function.*`, ...) and the critic's FSDP section from
`critic.model.fsdp_config` to `critic.fsdp`. A verl user's script may say either, so the schema has both: the 0.9 key
holds the default and is the one rlcore reads; the 0.8 key is accepted and, when set, its value is moved onto the 0.9
key as the config is composed (`move_renamed`), with a one-line note naming the new key (`renamed_notes`). Both set
to different values is an error (`renamed_errors`): which one the user meant cannot be told.

"Set" means named by a command-line override, or different from the schema's default (a recipe's or a YAML's
value): a 0.8 leaf whose default is None (verl 0.9's own legacy keys are null) is set when it is not None; a 0.8
section (the critic's fsdp_config) is compared leaf by leaf. An override wins over a recipe's value of the other name,
as it would of the same name.

This module imports neither torch nor ray.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Iterator

from omegaconf import DictConfig, OmegaConf

# (verl 0.9's key, verl 0.8's key): a leaf, or a section whose leaves pair up by name
RENAMED: tuple[tuple[str, str], ...] = (
    ("critic.fsdp", "critic.model.fsdp_config"),
    ("reward.num_workers", "reward_model.num_workers"),
    ("reward.reward_manager.name", "reward_model.reward_manager"),
    ("reward.reward_kwargs", "reward_model.reward_kwargs"),
    ("reward.custom_reward_function.path", "custom_reward_function.path"),
    ("reward.custom_reward_function.name", "custom_reward_function.name"),
    ("reward.reward_model.enable", "reward_model.enable"),
    ("reward.reward_model.enable_resource_pool", "reward_model.enable_resource_pool"),
    ("reward.reward_model.n_gpus_per_node", "reward_model.n_gpus_per_node"),
    ("reward.reward_model.nnodes", "reward_model.nnodes"),
    ("reward.reward_model.model_path", "reward_model.model.path"),
    ("reward.reward_model.rollout", "reward_model.rollout"),
)

# (the key rlcore reads, verl 0.9's other key for the same setting): verl 0.9's engine workers read router replay
# from the Megatron engine's section (`actor.megatron.router_replay.mode`, its router-replay example), its legacy
# workers from the role's; rlcore has one setting, the role's. Moved, noted and conflict-checked as the renames are.
ENGINE_COPIES: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.actor.router_replay", "actor_rollout_ref.actor.megatron.router_replay"),
    ("actor_rollout_ref.ref.router_replay", "actor_rollout_ref.ref.megatron.router_replay"),
)
_PAIRS = tuple((new, old, "verl 0.8's name") for new, old in RENAMED) + tuple(
    (new, old, "verl 0.9's Megatron-engine copy") for new, old in ENGINE_COPIES)


@functools.lru_cache(maxsize=None)
def _defaults(schema: type) -> DictConfig:
    return OmegaConf.structured(schema)


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value as written (interpolations unresolved), None where the key is missing."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or leaf not in parent:
        return None
    # The node alone: converting the whole parent for one leaf made every compose() pay for the section's size
    node = parent._get_node(leaf)
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node._value()


def _leaves(cfg: DictConfig, key: str) -> Iterator[str]:
    """`key` itself, or every leaf under it when it is a typed section (a dict-valued key is one leaf)."""
    node = OmegaConf.select(cfg, key)
    if isinstance(node, DictConfig) and OmegaConf.get_type(node) not in (dict, None):
        for child in node.keys():
            yield from _leaves(cfg, f"{key}.{child}")
    else:
        yield key


def _named(overrides: Iterable[str]) -> Callable[[str], bool]:
    """Whether a leaf is named by one of the command-line overrides (itself, a section above it, or a key under it)."""
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    return lambda leaf: any(k == leaf or leaf.startswith(k + ".") or k.startswith(leaf + ".") for k in keys)


def _set_pairs(cfg: DictConfig, named: Callable[[str], bool] = lambda leaf: False) -> Iterator[tuple[str, str, str]]:
    """(new leaf, old leaf, what the old name is) of every 0.8 leaf (or engine copy) the config sets."""
    schema = OmegaConf.get_type(cfg)
    if schema is None or schema is dict:
        return
    defaults = _defaults(schema)
    for new, old, what in _PAIRS:
        if OmegaConf.select(cfg, old, default=None) is None and OmegaConf.select(cfg, new, default=None) is None:
            continue  # neither in this schema (the SFT and reward-model trainers')
        for leaf in _leaves(defaults, old):
            if named(leaf) or _raw(cfg, leaf) != _raw(defaults, leaf):
                yield new + leaf[len(old):], leaf, what


def _is_default(cfg: DictConfig, key: str) -> bool:
    return _raw(cfg, key) == _raw(_defaults(OmegaConf.get_type(cfg)), key)


def move_renamed(cfg: DictConfig, overrides: Iterable[str] = ()) -> None:
    """Moves each set 0.8 leaf's value onto its 0.9 key, unless that one is set too (renamed_errors reports that);
    `overrides`: the command line's, which win over a recipe's value of the other name. Idempotent: run as compose()
    finishes and again on the config Hydra hands rlcore-train."""
    named = _named(overrides)
    for new, old, _ in list(_set_pairs(cfg, named)):
        if named(old) and not named(new) or _is_default(cfg, new) and not named(new):
            OmegaConf.update(cfg, new, _raw(cfg, old), merge=False)


def renamed_errors(cfg: DictConfig) -> list[str]:
    """A 0.8 key and its 0.9 name both set, to different values."""
    return [f"{old}={_raw(cfg, old)} ({what}) and {new}={_raw(cfg, new)} are the same setting with two values; keep {new} "
            f"only" for new, old, what in _set_pairs(cfg) if _raw(cfg, new) != _raw(cfg, old)]


def renamed_notes(cfg: DictConfig) -> list[str]:
    """One line per set 0.8 key (or engine copy), naming the key rlcore reads."""
    return [f"{old}={_raw(cfg, old)}: {what} of {new}, read as that key" for new, old, what in _set_pairs(cfg)]


def renamed_from(key: str) -> str | None:
    """The 0.9 key a 0.8 key (leaf or under a renamed section) is read as; None for any other key."""
    for new, old, _ in _PAIRS:
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None
