"""algorithm.rollout_correction: verl's keys compose and validate; bad values are refused with the key and a fix."""

import pytest
from omegaconf import OmegaConf

from rlcore.algos import ROLLOUT_IS_LEVELS, ROLLOUT_RS_LEVELS
from rlcore.config import ConfigError, compose, validate_config
from rlcore.config.validate_rollout_corr import IS_LEVELS, RS_LEVELS

RC = "algorithm.rollout_correction"
BASE = compose(["recipe=tiny_cpu"])


def errors(**values) -> list[str]:
    cfg = OmegaConf.create(OmegaConf.to_container(BASE))
    for key, value in values.items():  # "$key": a key outside algorithm.rollout_correction
        OmegaConf.update(cfg, key[1:] if key.startswith("$") else f"{RC}.{key}", value)
    try:
        validate_config(cfg)
    except ConfigError as err:
        return err.messages
    return []


def test_the_config_level_names_are_the_registries():
    assert sorted(IS_LEVELS) == ROLLOUT_IS_LEVELS.names() and sorted(RS_LEVELS) == ROLLOUT_RS_LEVELS.names()


def test_verls_defaults_and_settings_validate():
    assert OmegaConf.to_container(BASE.algorithm.rollout_correction) == {
        "rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None, "rollout_rs_threshold": None, "bypass_mode": False,
        "loss_type": "ppo_clip", "rollout_is_batch_normalize": False}
    assert errors(rollout_is="sequence", rollout_is_batch_normalize=True, rollout_rs="geometric", rollout_rs_threshold=1.5) == []
    assert errors(bypass_mode=True) == []
    assert errors(bypass_mode=True, loss_type="reinforce", rollout_is="sequence", rollout_rs="token", rollout_rs_threshold=2.0) == []
    cfg = compose(["recipe=tiny_cpu", f"{RC}.rollout_is=token", f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=3"])
    assert (cfg.algorithm.rollout_correction.rollout_is, cfg.algorithm.rollout_correction.rollout_rs_threshold) == ("token", 3.0)


@pytest.mark.parametrize("values, message", [
    (dict(rollout_is="sequense"), f"{RC}.rollout_is=sequense is not one of token, sequence; use {RC}.rollout_is=sequence"),
    (dict(rollout_rs="geometrc", rollout_rs_threshold=2.0), f"{RC}.rollout_rs=geometrc is not one of token, sequence, geometric; use {RC}.rollout_rs=geometric"),
    (dict(rollout_rs="token"), f"{RC}.rollout_rs=token keeps the ratios in [1/rollout_rs_threshold, rollout_rs_threshold], but "
                               f"{RC}.rollout_rs_threshold=None; use {RC}.rollout_rs_threshold=2.0 (it must be > 1)"),
    (dict(rollout_is_threshold=0.5), f"{RC}.rollout_is_threshold=0.5 must be > 1"),
    (dict(loss_type="reinforce"), f"{RC}.loss_type=reinforce is bypass mode's loss and has no effect without it; set "
                                  f"{RC}.bypass_mode=True, or {RC}.loss_type=ppo_clip"),
    (dict(loss_type="ppo"), f"{RC}.loss_type=ppo is not one of ppo_clip, reinforce; use {RC}.loss_type=ppo_clip"),
    (dict(rollout_is_batch_normalize=True), f"{RC}.rollout_is=null computes none; set {RC}.rollout_is=token"),
    (dict(bypass_mode=True, rollout_is="token"), f"{RC}.rollout_is=token has no effect with bypass_mode and loss_type=ppo_clip"),
    (dict(bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_batch_normalize=True),
     f"{RC}.rollout_is_batch_normalize=True: in bypass mode rlcore forms the IS weights per micro-batch"),
    (dict(rollout_is="token", **{"$actor_rollout_ref.actor.policy_loss.loss_mode": "geo_mean"}),
     f"{RC}.rollout_is=token with actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean (GMPO): its loss is per sequence"),
    (dict(bypass_mode=True, **{"$actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"}),
     f"{RC}.bypass_mode=True uses PPO's clipped loss (or loss_type=reinforce) in place of actor_rollout_ref.actor.policy_loss.loss_mode=gspo"),
])
def test_bad_values_are_refused_with_the_fix(values, message):
    found = errors(**values)
    assert len(found) == 1 and message in found[0], found
