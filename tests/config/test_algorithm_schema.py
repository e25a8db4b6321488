"""algorithm.rollout_correction: verl's keys compose and validate; bad values are refused with the key and a fix."""

import pytest
from omegaconf import OmegaConf

from rlcore.algos import ROLLOUT_IS_LEVELS, ROLLOUT_RS_LEVELS
from rlcore.algos.rollout_corr import ROLLOUT_RS_AGGREGATIONS, ROLLOUT_RS_STATISTICS
from rlcore.config import ConfigError, compose, validate_config
from rlcore.config.algorithm_schema import IS_LEVELS, RS_LEVELS, RS_MODES, RejectionRule, parse_rejection_rules

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
    assert errors(rollout_is="token", rollout_is_threshold="0.5_4.0") == []  # verl 0.9's IcePop band
    assert errors(bypass_mode=True, loss_type="reinforce", rollout_is="sequence", rollout_rs="token", rollout_rs_threshold=2.0) == []
    cfg = compose(["recipe=tiny_cpu", f"{RC}.rollout_is=token", f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=3"])
    assert (cfg.algorithm.rollout_correction.rollout_is, cfg.algorithm.rollout_correction.rollout_rs_threshold) == ("token", 3.0)


@pytest.mark.parametrize("values, message", [
    (dict(rollout_is="sequense"), f"{RC}.rollout_is=sequense is not one of token, sequence; use {RC}.rollout_is=sequence"),
    (dict(rollout_rs="geometrc", rollout_rs_threshold=2.0), f"{RC}.rollout_rs=geometrc is not one of token_k1, token_k2, token_k3, "
     f"seq_sum_k1, seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3, seq_max_k2, seq_max_k3 (or rlcore's earlier token, "
     f"sequence, geometric); use {RC}.rollout_rs=geometric"),
    (dict(rollout_rs="token"), f"{RC}.rollout_rs=token keeps the ratios in [1/rollout_rs_threshold, rollout_rs_threshold], but "
                               f"{RC}.rollout_rs_threshold=None; use {RC}.rollout_rs_threshold=2.0 (it must be > 1)"),
    (dict(rollout_is_threshold=0.5), f"{RC}.rollout_is_threshold=0.5 must be > 1"),
    (dict(rollout_is_threshold="2_1"), f"{RC}.rollout_is_threshold=2_1: a band lower_upper needs 0 < lower <= upper"),
    (dict(rollout_is_threshold="high"), f"{RC}.rollout_is_threshold='high' is not a number or a band"),
    (dict(loss_type="reinforce"), f"{RC}.loss_type=reinforce is bypass mode's loss and has no effect without it; set "
                                  f"{RC}.bypass_mode=True, or {RC}.loss_type=ppo_clip"),
    (dict(loss_type="ppo"), f"{RC}.loss_type=ppo is not one of ppo_clip, reinforce; use {RC}.loss_type=ppo_clip"),
    (dict(rollout_is_batch_normalize=True), f"{RC}.rollout_is=null computes none; set {RC}.rollout_is=token"),
    (dict(rollout_is="token", **{"$actor_rollout_ref.actor.policy_loss.loss_mode": "geo_mean"}),
     f"{RC}.rollout_is=token with actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean (GMPO): its loss is per sequence"),
    (dict(bypass_mode=True, **{"$actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"}),
     f"{RC}.bypass_mode=True uses PPO's clipped loss (or loss_type=reinforce) in place of actor_rollout_ref.actor.policy_loss.loss_mode=gspo"),
])
def test_bad_values_are_refused_with_the_fix(values, message):
    found = errors(**values)
    assert len(found) == 1 and message in found[0], found


def test_what_verl_runs_without_effect_in_bypass_mode_is_warned_not_refused():
    # verl 0.9's rollout-correction scripts: rollout_is with ppo_clip (weights computed, not applied), and batch
    # normalisation, which in bypass mode is over each micro-batch (verl: and over the data-parallel ranks)
    from rlcore.config.algorithm_schema import rollout_correction_warnings

    def warnings(**values):
        cfg = compose(["recipe=tiny_cpu"] + [f"{RC}.{k}={v}" for k, v in values.items()])
        assert errors(**values) == []
        return rollout_correction_warnings(cfg)

    assert [w.split(" has ")[0] for w in warnings(bypass_mode=True, rollout_is="token")] == [f"{RC}.rollout_is=token"]
    found = warnings(bypass_mode=True, loss_type="reinforce", rollout_is="sequence", rollout_is_batch_normalize=True)
    assert len(found) == 1 and "divides the IS weights by their mean over each micro-batch" in found[0]
    assert warnings(rollout_is="sequence", rollout_is_batch_normalize=True) == []  # decoupled: over the whole batch


# verl b178a3c, verl/trainer/ppo/rollout_corr_helper.py: SUPPORTED_ROLLOUT_RS_OPTIONS
VERL_RS_MODES = {"token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1", "seq_mean_k2",
                 "seq_mean_k3", "seq_max_k2", "seq_max_k3"}


def test_the_rs_modes_are_verls_and_pair_the_algos_registries():
    pairs = {f"{a}_{k}" for a in ROLLOUT_RS_AGGREGATIONS.names() for k in ROLLOUT_RS_STATISTICS.names()}
    assert set(RS_MODES) == VERL_RS_MODES == pairs - {"seq_max_k1"}


def test_verls_multi_mode_example_composes_and_validates():
    # verl's examples/rollout_correction/run_with_rollout_corr_multi_rs.sh quotes both values (Hydra reads an unquoted a,b
    # as a sweep); an unquoted band 0.6_1.6 is a string to Hydra too
    cfg = compose(["recipe=tiny_cpu", f"{RC}.rollout_is=token", f"{RC}.rollout_rs='token_k1,seq_max_k2'",
                   f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'"])
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_rs, rc.rollout_rs_threshold) == ("token_k1,seq_max_k2", "0.6_1.6,2.5")
    rules = [RejectionRule("token_k1", 0.6, 1.6), RejectionRule("seq_max_k2", None, 2.5)]
    assert parse_rejection_rules(rc.rollout_rs, rc.rollout_rs_threshold) == rules
    validate_config(cfg)
    assert compose(["recipe=tiny_cpu", f"{RC}.rollout_rs_threshold=0.6_1.6"]).algorithm.rollout_correction.rollout_rs_threshold == "0.6_1.6"
    for rs, threshold in [("seq_sum_k1", "0.5_2.0"), ("seq_mean_k3", 0.01), ("token_k2,token_k3", 2), ("geometric", "0.9_1.2"),
                          ("token_k1 , seq_mean_k2", " 2.0 , 2.5 ")]:
        assert errors(rollout_rs=rs, rollout_rs_threshold=threshold) == [], (rs, threshold)


def test_a_single_number_is_shared_and_is_the_band_one_over_t_to_t_for_k1():
    assert parse_rejection_rules("token,seq_max_k3", 2.0) == [RejectionRule("token_k1", 0.5, 2.0), RejectionRule("seq_max_k3", None, 2.0)]
    assert parse_rejection_rules("seq_mean_k1", "1.25") == [RejectionRule("seq_mean_k1", 0.8, 1.25)]


RS, RST = f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold"


@pytest.mark.parametrize("rs, threshold, message", [
    ("token_k1,seq_max_k1", "0.6_1.6,2.5", f"{RS}=token_k1,seq_max_k1: seq_max_k1 is not one of token_k1, token_k2"),
    ("token_k1,seq_max_k1", "0.6_1.6,2.5", f"use {RS}=token_k1,seq_max_k2"),
    ("token_kl", 2.0, f"use {RS}=token_k1"),
    (" , ", 2.0, f"{RS}=' , ' names no mode; use {RS}=null to turn rejection off"),
    ("token,token_k1", 2.0, f"{RS}=token,token_k1 lists token_k1 more than once"),
    ("token_k1,seq_max_k2", None, f"{RS}=token_k1,seq_max_k2 needs a threshold per mode, but {RST}=None; use {RST}='0.5_2.0,2.5'"),
    ("token_k1,seq_max_k2", "0.6_1.6,2.5,3", f"{RST}='0.6_1.6,2.5,3' has 3 thresholds for the 2 modes of {RS}=token_k1,seq_max_k2; "
                                             f"give one per mode in the same order (or one for all)"),
    ("seq_max_k2", "0.5_2.5", f"{RST}='0.5_2.5': seq_max_k2's threshold '0.5_2.5' must be one positive upper bound on the k2 divergence"),
    ("token_k3", -1.0, f"{RST}=-1.0: token_k3's threshold '-1.0' must be one positive upper bound"),
    ("token_k2", "abc", f"{RST}='abc': token_k2's threshold 'abc' must be one positive upper bound"),
    ("token_k1", "1.6_0.6", f"{RST}='1.6_0.6': token_k1's threshold '1.6_0.6' must be a band 0 < lower < upper of ratios"),
    ("token_k1", "0.5_x", f"{RST}='0.5_x': token_k1's threshold '0.5_x' is not a number or a 'lower_upper' band"),
    ("seq_sum_k1", 0.52, "keeps the ratios in [1/0.52, 0.52], which is empty (an unquoted 0.5_2 reads as the number 0.52: write '0.5_2.0')"),
    ("sequence", 1.0, f"{RST}=1.0: seq_sum_k1's threshold '1.0' keeps the ratios in [1/1.0, 1.0], which is empty; use a number > 1"),
    ("token_k2", True, f"{RST}=True must be a number or a string of comma-separated thresholds; use {RST}='2.5'"),
])
def test_bad_rejection_rules_are_refused_with_the_key_and_a_fix(rs, threshold, message):
    found = errors(rollout_rs=rs, rollout_rs_threshold=threshold)
    assert len(found) == 1 and message in found[0], found
    with pytest.raises(ValueError, match="algorithm.rollout_correction.rollout_rs"):  # the run's own parse says the same
        parse_rejection_rules(rs, threshold)
