"""Ulysses keys as verl writes them: either of a role's two places, the rules (FSDP2, packed, sizes that divide the
node and the heads), the batch plan's data-parallel size, and verl's example command lines composing and validating."""

import pytest

from rlcore.config import compose
from rlcore.config.fsdp_schema import role_sp
from rlcore.config.validate import diagnose

ARR = "actor_rollout_ref"
PACKED = [f"{ARR}.model.use_remove_padding=True"]  # the default; spelled out where a test turns it off


def _diagnose(overrides, recipe="tiny_cpu"):
    return diagnose(compose([f"recipe={recipe}", *overrides]))


@pytest.mark.parametrize("key", [f"{ARR}.actor.ulysses_sequence_parallel_size", f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size"])
def test_either_place_sets_the_actor_and_reference_size(key):
    cfg = compose(["recipe=tiny_cpu", *PACKED, f"{key}=2"])
    get = lambda k: __import__("omegaconf").OmegaConf.select(cfg, k)  # noqa: E731
    assert role_sp(get, "actor") == role_sp(get, "ref") == 2
    plan, errors = diagnose(cfg)
    assert errors == [] and plan.dp_size == 1  # 2 ranks / sp 2: both ranks hold the same samples


@pytest.mark.parametrize("overrides, fragment", [
    ([f"{ARR}.actor.ulysses_sequence_parallel_size=2", f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size=4"],
     "disagree (verl reads either place)"),
    ([f"{ARR}.actor.ulysses_sequence_parallel_size=2", f"{ARR}.ref.ulysses_sequence_parallel_size=4"],
     f"{ARR}.ref.ulysses_sequence_parallel_size=4 differs from the actor's"),
    ([f"{ARR}.actor.ulysses_sequence_parallel_size=4"], "must divide the ranks per node (trainer.n_gpus_per_node=2)"),
    ([f"{ARR}.actor.ulysses_sequence_parallel_size=0"], "ulysses_sequence_parallel_size=0 must be >= 1"),
])
def test_refusals_name_the_key_and_a_fix(overrides, fragment):
    _, errors = _diagnose(PACKED + overrides)
    assert any(fragment in e for e in errors), errors


def test_padded_batches_are_refused():
    _, errors = _diagnose([f"{ARR}.model.use_remove_padding=False", f"{ARR}.actor.ulysses_sequence_parallel_size=2"])
    assert any(f"slices the packed sequence, which needs {ARR}.model.use_remove_padding=True" in e for e in errors), errors


def test_megatron_is_refused_with_the_reason_and_ulysses_named():
    _, errors = diagnose(compose([*PACKED, f"{ARR}.actor.ulysses_sequence_parallel_size=2"], config_name="ppo_megatron_trainer"))
    assert any("(Ulysses) runs on the FSDP2 engine" in e for e in errors), errors
    _, errors = diagnose(compose([f"{ARR}.actor.megatron.context_parallel_size=2"], config_name="ppo_megatron_trainer"))
    assert any("TransformerEngine's attention" in e and "ulysses_sequence_parallel_size" in e for e in errors), errors


def test_reward_model_takes_ulysses():
    rm = ["reward.reward_model.enable=True", "reward.reward_model.model_path=.cache/tiny_cpu/sft_model", "reward_model.micro_batch_size_per_gpu=8",
          "reward_model.ulysses_sequence_parallel_size=2"]
    _, errors = _diagnose(rm)
    assert any("reward_model.ulysses_sequence_parallel_size=2 slices the packed sequence" in e for e in errors), errors
    _, errors = _diagnose(rm + ["reward_model.model.use_remove_padding=True"])
    assert not any("ulysses" in e for e in errors), errors


def test_critic_plans_over_its_data_parallel_ranks():
    critic = ["algorithm.adv_estimator=gae", "critic.model.path=.cache/tiny_cpu/sft_model", "critic.ppo_micro_batch_size_per_gpu=64",
              "critic.model.use_remove_padding=True", "critic.ulysses_sequence_parallel_size=2"]
    plan, errors = _diagnose(critic)
    assert not [e for e in errors if "critic" in e], errors
    assert plan.critic_micro_batches_per_mini_batch_per_rank == 4  # 32 x 8 samples on 1 critic replica / 64
