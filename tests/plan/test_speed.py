"""rlcore.plan.speed: settings that spend spare memory to save time, each offered only when the run planned with it
still fits with room in every phase."""

import re

import pytest

from rlcore.config import compose
from rlcore.plan.run_plan import plan_run
from rlcore.plan.speed import speed_hints

ARR = "actor_rollout_ref"


def hints(*overrides):
    cfg = compose(list(overrides))
    run, errors = plan_run(cfg)
    assert not errors, errors
    return speed_hints(cfg, run.batch, run.memory), run


def test_a_7b_on_80_gib_has_no_memory_to_spare_and_on_141_gib_takes_one_micro_batch_per_mini_batch():
    found, _ = hints("recipe=qwen2_7b_grpo")
    assert found == []  # without recomputation or with larger micro-batches the update would not fit with room
    found, run = hints("recipe=qwen2_7b_grpo", "trainer.device_memory_gb=141")
    whole = run.batch.samples_per_mini_batch_per_rank * run.batch.max_sequence_length
    assert [h.split(":")[0] for h in found] == [f"{ARR}.actor.ppo_max_token_len_per_gpu={whole}"]
    planned = float(re.search(r"then actor update plans ([\d.]+) of 141 GiB", found[0]).group(1))
    _, bigger = hints("recipe=qwen2_7b_grpo", "trainer.device_memory_gb=141", f"{ARR}.actor.ppo_max_token_len_per_gpu={whole}")
    assert planned == pytest.approx(next(r.peak for r in bigger.memory.roles if r.role == "actor update"), abs=0.05)


def test_checkpointing_and_a_sleeping_native_engine_are_named_where_the_device_has_room():
    tiny = ["recipe=tiny_cpu", "trainer.device=cuda", "trainer.device_memory_gb=2", f"{ARR}.model.enable_gradient_checkpointing=True"]
    found, _ = hints(*tiny)
    assert [h.split(":")[0] for h in found] == [f"{ARR}.model.enable_gradient_checkpointing=False", f"{ARR}.rollout.free_cache_engine=False"]
    assert "captures its decode graphs once" in found[1] and "of 2 GiB" in found[1]
    eager, _ = hints(*tiny, f"{ARR}.rollout.enforce_eager=True")  # no graphs to keep
    assert [h.split(":")[0] for h in eager] == [f"{ARR}.model.enable_gradient_checkpointing=False"]
    assert hints(*tiny[:1], "trainer.device_memory_gb=2", f"{ARR}.model.enable_gradient_checkpointing=True")[0] == []  # CPU
    assert hints(*tiny[:2], "trainer.device_memory_gb=0.5")[0] == []  # a run that does not fit gets no speed hints
    unplanned = ["trainer.device=cuda", "algorithm.adv_estimator=grpo", f"{ARR}.model.path=/nowhere/model",
                 f"{ARR}.model.enable_gradient_checkpointing=True"]
    cfg = compose(unplanned)  # a model the plan cannot read (rlcore-plan --elsewhere): no roles, no hints
    run, _ = plan_run(cfg)
    assert run.memory.roles == [] and speed_hints(cfg, run.batch, run.memory) == []
