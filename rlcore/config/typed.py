"""A run's config as the schema's objects: what the controller hands its workers after validation.

Hydra composes and the validator reads a DictConfig (it can name keys, interpolations and verl's key statuses);
past validation nothing needs that, so the runtime reads the schema's dataclasses: a misspelt attribute fails
where it is read, each default is the schema's, and a dict-valued key (override_config, engine_kwargs) is a
plain dict. Torch-free, like the rest of rlcore.config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


def typed(config: Any, schema: type[T]) -> T:
    """`config` (a composed DictConfig, a dict of it, or already `schema`'s object) as `schema`'s object. A dict is
    laid over the schema's defaults, so a section it lacks is the schema's, and a key the schema lacks raises."""
    if isinstance(config, schema):
        return config
    if not (OmegaConf.is_config(config) and OmegaConf.get_type(config) is schema):
        config = OmegaConf.merge(OmegaConf.structured(schema), config)
    return OmegaConf.to_object(config)


def plain(value: Any) -> Any:
    """A section or a dict- or list-valued key as plain Python, from a config node or from the typed config."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def dotted(config: Any) -> Callable[[str], Any]:
    """`get(key)` over `config` (typed or a DictConfig) for the shared rules that read dotted keys
    (the sections' rules: unmerged_lora_rank, uses_topk, ...); None where a section lacks the key, as
    OmegaConf.select answers."""

    def get(key: str) -> Any:
        node = config
        for part in key.split("."):
            node = getattr(node, part, None)
            if node is None:
                return None
        return node

    return get


def as_dictconfig(config: Any) -> Any:
    """The typed config as a DictConfig again, for code written against verl's (a user's agent loop reads its
    trainer_config with .get and OmegaConf.select)."""
    return config if OmegaConf.is_config(config) else OmegaConf.structured(config)
