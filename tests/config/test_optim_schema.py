"""rlcore/config/optim_schema.py: the schedule's two names and the optimizer overrides, refused with the key and
the fix, through the PPO trainer's validation and the SFT trainer's alike."""

import pytest

from rlcore.config import compose
from rlcore.config.validate import ConfigError, validate_config
from rlcore.train_sft import compose_sft, sft_config_errors

OPTIM = "actor_rollout_ref.actor.optim"
OVERRIDE = f"+{OPTIM}.override_optimizer_config"


def errors(*overrides, config_name="ppo_trainer"):
    with pytest.raises(ConfigError) as info:
        validate_config(compose(["recipe=tiny_cpu", *overrides], config_name=config_name))
    return info.value.messages


def test_verls_megatron_schedule_name_is_accepted_and_two_different_schedules_are_refused():
    assert validate_config(compose(["recipe=tiny_cpu", f"{OPTIM}.lr_decay_style=cosine"]))
    assert validate_config(compose(["recipe=tiny_cpu", f"{OPTIM}.lr_decay_style=linear", f"{OPTIM}.lr_scheduler_type=linear"]))
    assert errors(f"{OPTIM}.lr_decay_style=cosine", f"{OPTIM}.lr_scheduler_type=linear") == [
        f"{OPTIM}.lr_decay_style=cosine and {OPTIM}.lr_scheduler_type=linear name two schedules (verl's names for the same "
        "thing); set one of them"]
    assert errors(f"{OPTIM}.lr_decay_style=wsd") == [f"{OPTIM}.lr_decay_style=wsd is not one of constant, cosine, linear, inverse_square_root"]
    # verl's older FSDP name, warmup_style, likewise
    assert validate_config(compose(["recipe=tiny_cpu", f"{OPTIM}.warmup_style=cosine"]))
    assert errors(f"{OPTIM}.warmup_style=cosine", f"{OPTIM}.lr_decay_style=linear") == [
        f"{OPTIM}.lr_decay_style=linear and {OPTIM}.warmup_style=cosine name two schedules; set one of them"]


def test_adamw_overrides_must_be_adamw_arguments_that_no_optim_key_sets():
    assert validate_config(compose(["recipe=tiny_cpu", f"{OVERRIDE}.eps=1e-6", f"{OVERRIDE}.foreach=False"]))
    bad = errors(f"{OVERRIDE}.lr=0.1", f"{OVERRIDE}.optimizer_cpu_offload=True")
    assert bad[0] == f"{OPTIM}.override_optimizer_config.lr is set by optim.lr; use that key"
    assert bad[1].startswith(f"{OPTIM}.override_optimizer_config.optimizer_cpu_offload is not an argument of torch.optim.AdamW "
                             "(the FSDP2 engine's optimizer); valid: amsgrad, capturable,")
    sft = compose_sft(["+optim.override_optimizer_config.epsilon=1e-6"], config_name="sft_tiny_cpu")
    assert any(e.startswith("optim.override_optimizer_config.epsilon is not an argument of torch.optim.AdamW") for e in sft_config_errors(sft))


def test_megatron_overrides_must_be_optimizer_config_fields_and_cpu_offload_needs_cuda():
    pytest.importorskip("megatron.core")
    megatron = ["actor_rollout_ref.actor.strategy=megatron"]
    hybrid = [f"{OVERRIDE}.optimizer_cpu_offload=True", f"{OVERRIDE}.optimizer_offload_fraction=1.0",
              f"{OVERRIDE}.overlap_cpu_optimizer_d2h_h2d=True", f"{OVERRIDE}.use_precision_aware_optimizer=True"]
    assert validate_config(compose(["recipe=tiny_cpu", *megatron, *hybrid, "trainer.device=cuda"], config_name="ppo_megatron_trainer"))
    on_cpu = errors(*megatron, *hybrid, f"{OVERRIDE}.optimizer_cpu_ofload=True", config_name="ppo_megatron_trainer")
    assert on_cpu == [
        f"{OPTIM}.override_optimizer_config.optimizer_cpu_offload=True needs CUDA (megatron-core's HybridDeviceOptimizer copies "
        "between CUDA streams); on trainer.device=cpu the optimizer state is in host memory already: drop it",
        f"{OPTIM}.override_optimizer_config.optimizer_cpu_ofload is not a field of megatron-core's OptimizerConfig (see "
        "megatron/core/optimizer/optimizer_config.py: e.g. optimizer_cpu_offload, use_precision_aware_optimizer, main_grads_dtype)"]
