"""Keys the schema does not have: what a `+key=value` typo adds, and Hydra's own "not in struct" refusals.

Hydra's `+` adds a key even inside a typed section (its hint for a misspelled key is to add `+`), so
`+actor_rollout_ref.rollout.gpu_memory_utilisation=0.6` would compose and do nothing. Every typed section (a
dataclass of rlcore/config/*schema.py) takes only its fields; sections typed as free dicts (`engine_kwargs.vllm`,
`override_config`, ...) take anything. Each message names the key and the closest real one.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from rlcore.config.verl_features import not_a_verl_key, verl_feature


def _typed_children(node: DictConfig, prefix: str) -> Iterator[tuple[str, DictConfig, type]]:
    kind = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(kind):
        yield prefix, node, kind
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                yield from _typed_children(child, f"{prefix}{key}.")


def all_keys(cfg: DictConfig) -> list[str]:
    """Every leaf and section key of the typed tree (for suggestions)."""
    keys = []
    for prefix, node, kind in _typed_children(cfg, ""):
        keys += [prefix + f.name for f in dataclasses.fields(kind)]
    return keys


def closest_key(wrong: str, cfg: DictConfig) -> Optional[str]:
    """The schema key most like `wrong`: a similar name in the same section, else the same name in another
    section (`rollout.use_kl_loss` -> `actor.use_kl_loss`), else a similar full key anywhere."""
    keys = all_keys(cfg)
    section, _, leaf = wrong.rpartition(".")
    prefix = section + "." if section else ""
    siblings = [k[len(prefix):] for k in keys if k.startswith(prefix) and "." not in k[len(prefix):]]
    found = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.75)
    if found:
        return prefix + found[0]
    same_name = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    if same_name:
        return same_name[0]
    found = difflib.get_close_matches(wrong, keys, n=1, cutoff=0.85)
    return found[0] if found else None


def unknown_key_errors(cfg: DictConfig) -> list[str]:
    """Keys inside typed sections that the schema does not define (added with `+key=value`)."""
    errors = []
    for prefix, node, kind in _typed_children(cfg, ""):
        fields = {f.name for f in dataclasses.fields(kind)}
        for key in node.keys():
            if key not in fields:
                errors.append(unknown_key_message(prefix + str(key), cfg, added=True))
    return errors


def unknown_key_message(key: str, cfg: DictConfig, added: bool = False) -> str:
    feature = verl_feature(key)
    if feature:  # a verl key, not a typo: "did you mean" would point at a key that does something else
        return f"{key} is verl's {feature[0]}; not supported by rlcore: {feature[1]}"
    meant = not_a_verl_key(key)
    if meant:
        return f"{key} is not a config key in verl 0.9 either (verl's Hydra refuses it too); {meant}"
    close = closest_key(key, cfg)
    hint = f"did you mean {close}?" if close else "see rlcore/config/*schema.py (or verl's key tree) for the keys"
    how = " (`+` adds a key, but this section's keys are fixed)" if added else ""
    return f"{key} is not a config key{how}; {hint}"


_NOT_IN_STRUCT = re.compile(r"Could not (?:override|append to|delete from) '([^']+)'|full_key: (\S+)")


def explain_compose_error(message: str, cfg_for_keys: Optional[DictConfig]) -> str:
    """Hydra's message for a key it refused, with the closest real key (one line), or the message unchanged."""
    text = " ".join(message.split())
    if "Ambiguous value for argument" in text:
        return (f"{text.split(' 1. ')[0]}: to plan or train each value, add -m (a sweep); for a list use key=[a,b]; "
                f"for one string with commas quote it: key='a,b'")
    match = _NOT_IN_STRUCT.search(message)
    if not match or not any(s in text for s in ("not in struct", "Could not override", "ConfigKeyError")):
        return text
    key = (match.group(1) or match.group(2)).lstrip("+~")
    if cfg_for_keys is None and verl_feature(key) is None:  # no tree to suggest from (a YAML's own key that fails)
        return text
    return unknown_key_message(key, cfg_for_keys)
