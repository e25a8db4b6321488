"""The doctor's fixes, applied, never make a new error: over every recipe and a set of perturbations a user makes.

A fix that leads to another error (two batch fixes that contradict each other, a memory lever that the next run
reverses) sends a user in circles. Every `use key=value` of every error, every `did you mean key=value`, and every
role's largest memory lever is applied alone, and the doctor runs again:
- no error about a setting the first run did not complain about (errors are identified by their leading key=value);
- fewer errors than before for an error's fix;
- for a lever: the role's peak drops, and no lever of the new run sets the same key back.
"""

import functools
import re

import pytest
from omegaconf import OmegaConf

from rlcore.cli.plan import composer

PPO_RECIPES = ["qwen2_7b_grpo", "qwen2_7b_grpo_lora", "ppo_7b_colocate", "llama_70b_multinode", "qwen2_32b_grpo_megatron",
               "qwen2_5_3b_gsm8k_tools", "llama3_8b_rm_lora", "tiny_cpu", "tiny_cpu_ppo", "tiny_cpu_lora"]
PERTURBATIONS = [
    [],
    ["trainer.n_gpus_per_node=6"],
    ["trainer.device_memory_gb=24"],
    ["trainer.device_memory_gb=40"],
    ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
    ["actor_rollout_ref.actor.ppo_mini_batch_size=300"],
    ["data.train_batch_size=1000"],
    ["actor_rollout_ref.rollout.n=3"],
    ["algorithm.adv_estimator=grpoo"],
]
CASES = [("ppo_trainer", [f"recipe={r}", *p]) for r in PPO_RECIPES for p in PERTURBATIONS]
CASES += [("ppo_megatron_trainer", ["recipe=qwen2_7b_grpo", *p]) for p in PERTURBATIONS]
SETTING = re.compile(r"([A-Za-z_][\w.]*=[^\s;,()?]+)")


def run(config_name: str, overrides: list[str]):
    return _run(config_name, tuple(overrides))


# Fixes and levers of different cases often lead to the same command line (15% of the runs): each is composed and
# checked once. The tests only read what they get back.
@functools.cache
def _run(config_name: str, overrides: tuple[str, ...]):
    return composer(config_name)[1](_compose(config_name, overrides), "elsewhere")  # the GPU recipes' paths are elsewhere


@functools.cache
def _compose(config_name: str, overrides: tuple[str, ...]):
    return composer(config_name)[0](list(overrides))


def identity(error: str) -> str:
    """What an error is about: the key it starts with."""
    return error.split(" ", 1)[0].split(":", 1)[0].split("=", 1)[0]


def error_fixes(error: str) -> list[list[str]]:
    """Each alternative the message offers, applied whole: `use a=1 or a=2` -> [["a=1"], ["a=2"]];
    `use a=1 b=2` -> [["a=1", "b=2"]]; `did you mean a=b?` -> [["a=b"]]."""
    fixes = []
    for clause in re.findall(r"(?:use|did you mean) ((?:[\w.]+=[^\s;,()?]+(?: or | )?)+)", error):
        fixes += [SETTING.findall(part) for part in clause.split(" or ")]
    return [f for f in fixes if f and all("." in s.split("=")[0] for s in f)]


def lever_settings(lever: str) -> list[str]:
    """`a=1 b=2 (why)` -> ["a=1", "b=2"]: a lever is applied whole."""
    return SETTING.findall(lever.split(" (", 1)[0])


@pytest.mark.parametrize("config_name, overrides", CASES, ids=[f"{c}:{' '.join(o)}" for c, o in CASES])
def test_every_suggested_fix_applied_makes_no_new_error(config_name, overrides):
    before = run(config_name, overrides)
    before_ids = {identity(e) for e in before.errors}
    for error in before.errors:
        for fix in error_fixes(error):
            after = run(config_name, overrides + fix)
            new = [e for e in after.errors if identity(e) not in before_ids]
            assert not new, f"fix {fix} (for: {error}) made new errors: {new}"
            if "did you mean" in error:  # the right name's own rules may apply now (grpo needs n > 1): not a circle
                continue
            assert len(after.errors) < len(before.errors), f"fix {fix} fixed nothing: {after.errors}"
    if before.errors:
        return  # levers are read off a valid config (the memory plan of an invalid one is partial)
    for role in before.memory.roles:
        if role.verdict == "fits" or not role.levers:
            continue
        lever = role.levers[0][0]
        settings = lever_settings(lever)
        assert settings, f"{role.role}'s largest lever is not a setting to apply: {lever!r}"
        after = run(config_name, overrides + settings)
        assert not after.errors, f"{role.role}: lever {lever} made errors: {after.errors}"
        again = next(r for r in after.memory.roles if r.role == role.role)
        starved = role.note.startswith("OOM")  # vLLM's share holds no sequence: the lever feeds it, not shrinks it
        assert again.peak < role.peak or starved and not again.note.startswith("OOM"), \
            f"{role.role}: lever {lever} did not help ({role.peak:.1f} -> {again.peak:.1f} GiB; {again.note})"
        was = {s.split("=")[0]: str(OmegaConf.select(_compose(config_name, tuple(overrides)), s.split("=")[0])) for s in settings}
        back = [s for r in after.memory.roles if r.levers for s in lever_settings(r.levers[0][0])
                if s.split("=")[0] in was and s.split("=", 1)[1] == was[s.split("=")[0]]]
        assert not back, f"{role.role}: after {lever}, the doctor suggests {back}, the value it had: a circle"
