"""Rules for verl's train-inference mismatch correction (`algorithm.rollout_correction.*`, applied by
rlcore/algos/rollout_corr.py). `c` is validate's checker (get / error / choice). Imports neither torch nor ray, so
the level names are repeated here; tests/config/test_validate.py checks them against the algos registries."""

from __future__ import annotations

RC = "algorithm.rollout_correction"
IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")
LOSS_TYPES = ("ppo_clip",)
_UNSUPPORTED_LOSS = {"reinforce": "(verl's bypass-mode REINFORCE with explicit IS weights) is not implemented in rlcore; use {key}=ppo_clip, "
                                  "whose clipped ratio to the rollout policy does the correction"}


def check_rollout_correction(c) -> None:
    rollout_is, rollout_rs = c.get(f"{RC}.rollout_is"), c.get(f"{RC}.rollout_rs")
    if rollout_is is not None:
        c.choice(f"{RC}.rollout_is", IS_LEVELS)
    if rollout_rs is not None:
        c.choice(f"{RC}.rollout_rs", RS_LEVELS)
    c.choice(f"{RC}.loss_type", LOSS_TYPES, _UNSUPPORTED_LOSS)
    threshold = c.get(f"{RC}.rollout_is_threshold")
    if threshold is None or threshold <= 1:  # at or below 1 every ratio above 1 is truncated and the band is empty
        c.error(f"{RC}.rollout_is_threshold={threshold} must be > 1 (IS weights are truncated there, and ratios past it or "
                f"below its inverse are counted); use {RC}.rollout_is_threshold=2.0")
    rs_threshold = c.get(f"{RC}.rollout_rs_threshold")
    if rollout_rs is not None and (rs_threshold is None or rs_threshold <= 1):
        c.error(f"{RC}.rollout_rs={rollout_rs} keeps the ratios in [1/rollout_rs_threshold, rollout_rs_threshold], but "
                f"{RC}.rollout_rs_threshold={rs_threshold}; use {RC}.rollout_rs_threshold=2.0 (it must be > 1)")
    if c.get(f"{RC}.rollout_is_batch_normalize") and rollout_is is None:
        c.error(f"{RC}.rollout_is_batch_normalize=True normalises IS weights, but {RC}.rollout_is=null computes none; "
                f"set {RC}.rollout_is=token (or sequence), or drop rollout_is_batch_normalize")
    if c.get(f"{RC}.bypass_mode") and (rollout_is is not None or rollout_rs is not None):
        c.error(f"{RC}.bypass_mode=True skips the old-log-prob pass that rlcore computes {RC}.rollout_is / rollout_rs from "
                f"(bypass corrects through the PPO ratio to the rollout policy); set {RC}.bypass_mode=False to use them, "
                "or rollout_is=null rollout_rs=null")
