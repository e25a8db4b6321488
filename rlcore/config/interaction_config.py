"""Interaction configs in verl's YAML shape (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`):

    interaction:
      - name: gsm8k                                           # what a row's extra_info.interaction_kwargs.name picks
        class_name: rlcore.tools.interaction.Gsm8kInteraction     # package.module.ClassName
        config: {}                                            # the constructor's `config` (gets `name` added)

An interaction is a simulated user or environment: it answers each assistant turn that calls no tool, may end the
episode, and scores the turn (rlcore.tools.interaction). `load_interaction_config` checks every entry before Ray
starts and reports all problems at once, each naming the file, the entry and the fix, as the tool config does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlcore.config.tool_config import check_class, yaml_entries

_METHODS = ("start_interaction", "generate_response", "calculate_score", "finalize_interaction")


@dataclass(frozen=True)
class InteractionSpec:
    """One interaction of the config: the name rows choose it by, its class and its constructor's config."""

    name: str
    class_name: str  # "package.module.ClassName", imported in each rollout worker
    config: dict


def default_name(class_name: str) -> str:
    """verl's name for an entry without one: the class name, lower-cased, less an "Interaction" suffix."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def load_interaction_config(path: str) -> list[InteractionSpec]:
    """The interactions of a verl interaction-config YAML. Raises ValueError listing every problem."""
    entries = yaml_entries(path, "interaction", "interaction config", "name, class_name and config", "interactions/tiny_add.yaml")
    errors: list[str] = []
    specs: list[InteractionSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        spec = _spec(entry, f"interaction[{i}]", errors)
        if spec is None:
            continue
        if spec.name in seen:
            errors.append(f"interaction[{i}].name={spec.name!r} repeats interaction[{seen[spec.name]}]'s; give each its own name")
        seen.setdefault(spec.name, i)
        specs.append(spec)
    if errors:
        raise ValueError(f"interaction config {path} has {len(errors)} problem(s):\n" + "\n".join(f"  - {e}" for e in errors))
    return specs


def _spec(entry: Any, where: str, errors: list[str]) -> InteractionSpec | None:
    if not isinstance(entry, dict):
        errors.append(f"{where} is {type(entry).__name__}, not a mapping with name, class_name and config")
        return None
    before = len(errors)
    class_name = entry.get("class_name")
    check_class(class_name, f"{where}.class_name", errors, _METHODS, "rlcore.tools.interaction.BaseInteraction",
                "rlcore.tools.interaction.Gsm8kInteraction")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        errors.append(f"{where}.config is {type(config).__name__}; it must be a mapping (the constructor's options), or {{}}")
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        errors.append(f"{where}.name={name!r} must be a non-empty string (what rows' interaction_kwargs.name picks)")
    if len(errors) > before:
        return None
    name = name or default_name(class_name)
    return InteractionSpec(name, class_name, {**config, "name": name})  # verl injects the name into the config


def interaction_name_problem(row: dict[str, Any], names: set[str]) -> str | None:
    """A prompt row's check (rlcore.data.row_checks): its extra_info.interaction_kwargs.name names a configured
    interaction (verl's tool agent raises mid-run on a missing or unknown one)."""
    kwargs = (row.get("extra_info") or {}).get("interaction_kwargs")
    name = kwargs.get("name") if isinstance(kwargs, dict) else None
    if name is None:
        return (f"extra_info.interaction_kwargs.name is missing (an interaction is configured: the row names which of "
                f"{', '.join(sorted(names))} answers it)")
    if name not in names:
        return f"extra_info.interaction_kwargs.name={name!r} is not in the interaction config ({', '.join(sorted(names))})"
    return None
