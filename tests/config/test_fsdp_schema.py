"""The rules on every role's engine keys (rlcore/config/fsdp_schema.py): each refusal names the key and the fix."""

import pytest

from rlcore.config import compose
from rlcore.config.validate import diagnose

ARR = "actor_rollout_ref"


def errors(*overrides):
    return diagnose(compose(["recipe=tiny_cpu", *overrides]))[1]  # 2 ranks


def test_fsdp_size_must_divide_the_roles_ranks():
    assert not errors(f"{ARR}.actor.fsdp_config.fsdp_size=1")  # HSDP: 2 replicas of 1 shard
    (message,) = errors(f"{ARR}.actor.fsdp_config.fsdp_size=3")
    assert message.startswith(f"{ARR}.actor.fsdp_config.fsdp_size=3 must be -1") and "use one of -1, 1, 2" in message


def test_activation_offload_needs_fsdp2_and_checkpointing():
    offload = f"{ARR}.model.enable_activation_offload=True"
    assert not errors(offload, f"{ARR}.model.enable_gradient_checkpointing=True")
    (message,) = errors(offload)  # the tiny recipe does not checkpoint
    assert "set actor_rollout_ref.model.enable_gradient_checkpointing=True too" in message
    assert any("works with the FSDP2 engine" in e for e in errors(offload, f"{ARR}.actor.strategy=megatron",
                                                                   f"{ARR}.model.enable_gradient_checkpointing=True"))


@pytest.mark.parametrize("overrides, expected", [
    ((f"{ARR}.actor.checkpoint.save_contents=[model,weights]",), "save_contents: unknown item(s) ['weights']"),
    ((f"{ARR}.actor.checkpoint.save_contents=[model]", f"{ARR}.actor.checkpoint.load_contents=[model,optimizer]"),
     "load_contents asks for ['optimizer'], which actor_rollout_ref.actor.checkpoint.save_contents=['model'] never writes"),
])
def test_checkpoint_contents_are_verls_items_and_a_resuming_run_loads_what_it_saves(overrides, expected):
    assert any(expected in e for e in errors(*overrides)), errors(*overrides)


def test_loading_what_this_run_never_saves_is_fine_from_another_runs_checkpoint():
    assert not errors(f"{ARR}.actor.checkpoint.save_contents=[model]", f"{ARR}.actor.checkpoint.load_contents=[model,optimizer]",
                      "trainer.resume_mode=resume_path", "trainer.resume_from_path=/elsewhere/global_step_5")


def test_the_sft_and_reward_model_trainers_check_their_optimizer_and_fsdp_size():
    from rlcore.train_sft import compose_sft, sft_config_errors

    found = sft_config_errors(compose_sft(["optim.optimizer=Lion", "model.fsdp_config.fsdp_size=3", "trainer.n_gpus_per_node=4",
                                           "data.train_batch_size=16"]))
    assert any(e.startswith("optim.optimizer=Lion: rlcore trains with AdamW") for e in found), found
    assert any(e.startswith("model.fsdp_config.fsdp_size=3 must be -1") for e in found), found
