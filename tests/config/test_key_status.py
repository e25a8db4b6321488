"""Every key the schemas accept is wired (a behaviour test shows its effect), refused with the reason, or reported as
having no effect: no key is accepted and silently ignored (rlcore/config/key_status.py says why)."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from omegaconf import AnyNode, BooleanNode, FloatNode, IntegerNode, OmegaConf, StringNode

from rlcore.config import compose
from rlcore.config.key_status import NO_EFFECT, REFUSED, ineffective_settings, matching, schema_leaves
from rlcore.config.renamed import renamed_from
from rlcore.config.rm_schema import RMTrainerConfig
from rlcore.config.schema import PPOConfig
from rlcore.config.sft_schema import SFTTrainerConfig
from rlcore.config.validate import diagnose

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = Path(__file__).with_name("wired_keys.txt")
SCHEMAS = {"": PPOConfig, "sft:": SFTTrainerConfig, "rm:": RMTrainerConfig}  # registry prefix -> schema
KEYS = [prefix + key for prefix, schema in SCHEMAS.items() for key in schema_leaves(schema)]


def _registry() -> list[tuple[int, str, str]]:
    entries = []
    for number, line in enumerate(REGISTRY.read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            pattern, test = line.split()
            entries.append((number, pattern, test))
    return entries


def _bare(key: str) -> str:
    return key.split(":", 1)[-1]


def _status_patterns(key: str) -> list[str]:
    """The NO_EFFECT / REFUSED patterns that cover `key` (both lists name bare keys of any schema)."""
    return [p for p in (*NO_EFFECT, *REFUSED) if fnmatch.fnmatchcase(_bare(key), p)]


@lru_cache(maxsize=None)
def _package_text() -> str:
    """The package's source outside the schemas' fields and this status list: where a wired key must be read (a
    schema module's rules, after its `rules` line, count: they read keys as the runtime does)."""
    skip = ("key_status.py", "config_reference.py")  # the reference names keys to document them

    def code(path) -> str:
        text = path.read_text()
        return text.partition(" rules\n")[2] if path.name.endswith("schema.py") else text

    return "\n".join(code(p) for p in (ROOT / "rlcore").rglob("*.py") if not p.name.endswith(skip))


def test_every_schema_key_is_wired_refused_or_reported():
    """verl 0.8's names of keys verl 0.9 renamed have their 0.9 key's status (rlcore/config/renamed.py reads them as
    that key: tests/config/test_renamed.py)."""
    wired = [pattern for _, pattern, _ in _registry()]
    unplaced = [key for key in KEYS if not _status_patterns(key) and not matching_any(key, wired) and not renamed_from(_bare(key))]
    assert not unplaced, (
        f"{len(unplaced)} config key(s) with no status: wire each and add it to {REGISTRY.relative_to(ROOT)} with the "
        "test that shows its effect, or add it to NO_EFFECT (with the reason) or REFUSED (with a refused value) in "
        f"rlcore/config/key_status.py: {unplaced}")
    both = [key for key in KEYS if _status_patterns(key) and matching_any(key, wired)]
    assert not both, f"keys both wired and listed as refused / no effect (pick one): {both}"


def matching_any(key: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def test_each_wired_entry_names_a_test_of_its_key_and_code_that_reads_it():
    problems = []
    for number, pattern, test in _registry():
        keys = matching(pattern, KEYS)
        if not keys:
            problems.append(f"line {number}: {pattern} matches no schema key")
            continue
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else None
        if source is None:
            problems.append(f"line {number}: {path} does not exist")
            continue
        if name not in {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}:
            problems.append(f"line {number}: {path} has no test {name}")
        for leaf in {key.rsplit(".", 1)[-1].rpartition(":")[2] for key in keys}:  # a top-level sft:/rm: key has no dot
            if not re.search(rf"\b{leaf}\b", source):
                problems.append(f"line {number}: {path} never mentions {leaf}")
            if not re.search(rf"\b{leaf}\b", _package_text()):
                problems.append(f"line {number}: no code in rlcore/ reads {leaf} (accepted and ignored)")
    assert not problems, "\n".join(problems)


def _other_value(defaults, key: str):
    """A value of the key's type other than its default (None: a section or a dict, nothing simple to set)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(defaults, parent)._get_node(leaf)
    value = node._value()
    following = isinstance(value, str)  # an interpolation: the default follows another key (the global one)
    if isinstance(node, BooleanNode):
        return not OmegaConf.select(defaults, key) if following else not value
    if isinstance(node, (IntegerNode, FloatNode)):
        resolved = OmegaConf.select(defaults, key) if following else value  # a following key: other than what it follows
        return 1 if resolved is None else resolved + 1
    return "x" if isinstance(node, (StringNode, AnyNode)) and (value is None or isinstance(value, str)) else None


def test_no_effect_keys_set_by_the_user_are_reported_with_the_reason():
    defaults = OmegaConf.structured(PPOConfig)
    overrides, expected = [], []
    for pattern, why in NO_EFFECT.items():
        keys = matching(pattern, [_bare(k) for k in KEYS])
        assert keys, f"NO_EFFECT pattern {pattern} matches no schema key"
        ppo = [k for k in keys if k in set(schema_leaves(PPOConfig))]
        settable = [(k, _other_value(defaults, k)) for k in ppo]
        settable = [(k, v) for k, v in settable if v is not None]
        if settable:
            key, value = settable[0]
            overrides.append(f"{key}={value}")
            expected.append((key, why))
    assert ineffective_settings(compose([])) == [], "the default config itself sets a key that has no effect"
    lines = ineffective_settings(compose(overrides))
    for key, why in expected:
        assert any(line.startswith(f"{key}=") and line.endswith(why) for line in lines), f"{key} not reported"


@pytest.mark.parametrize("pattern", sorted(REFUSED))
def test_refused_keys_are_refused_naming_the_key(pattern):
    # Every key the pattern covers, each role's: the config reference calls each of them refused.
    for key in matching(pattern, list(schema_leaves(PPOConfig))):
        value, context = REFUSED[pattern]
        if key.startswith("critic.megatron."):  # the critic's section is read only when a Megatron critic runs
            context = (*context, "algorithm.adv_estimator=gae", "critic.strategy=megatron")
        setting = [f"+{key}.{k}={v}" for k, v in value.items()] if isinstance(value, dict) else [f"{key}={value}"]
        _, errors = diagnose(compose([*setting, *context]))
        read_as = renamed_from(key) or key  # another name of a key is refused as the key rlcore reads
        assert any(read_as in e for e in errors), f"{key}={value}: {errors}"


def test_rlcore_plan_lists_keys_set_with_no_effect_before_anything_else():
    out = subprocess.run([sys.executable, "-m", "rlcore.cli.plan", "actor_rollout_ref.rollout.layered_summon=True",
                          "trainer.device=cpu", "trainer.n_gpus_per_node=2"], capture_output=True, text=True, cwd=ROOT)
    lines = out.stdout.splitlines()
    assert lines[0] == "1 key(s) set with no effect:", out.stdout + out.stderr
    assert lines[1].startswith("  - actor_rollout_ref.rollout.layered_summon=True: accepted for verl compatibility, no effect")


def test_no_recipe_sets_a_key_that_has_no_effect():
    recipes = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        assert ineffective_settings(compose([f"recipe={recipe}"])) == [], recipe
