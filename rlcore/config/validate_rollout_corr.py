"""Rules for verl's train-inference mismatch correction (`algorithm.rollout_correction.*`, applied by
rlcore/algos/rollout_corr.py). `c` is validate's checker (get / error / choice). Imports neither torch nor ray, so
the level names are repeated here; tests/config/test_validate_rollout_corr.py checks them against the algos registries."""

from __future__ import annotations

RC = "algorithm.rollout_correction"
IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")
LOSS_TYPES = ("ppo_clip", "reinforce")


def check_rollout_correction(c) -> None:
    rollout_is, rollout_rs = c.get(f"{RC}.rollout_is"), c.get(f"{RC}.rollout_rs")
    if rollout_is is not None:
        c.choice(f"{RC}.rollout_is", IS_LEVELS)
    if rollout_rs is not None:
        c.choice(f"{RC}.rollout_rs", RS_LEVELS)
    c.choice(f"{RC}.loss_type", LOSS_TYPES)
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
    if rollout_is is not None and not c.get(f"{RC}.bypass_mode") and c.get("actor_rollout_ref.actor.policy_loss.loss_mode") == "geo_mean":
        # verl weighs GMPO's sequence loss by the geometric mean of the token weights; rlcore's weights scale tokens
        c.error(f"{RC}.rollout_is={rollout_is} with actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean (GMPO): its loss is "
                "per sequence and rlcore's IS weights are per token; use rollout_rs (rejection) or bypass_mode instead")
    if c.get(f"{RC}.bypass_mode"):
        _check_bypass(c, rollout_is)
    elif c.get(f"{RC}.loss_type") == "reinforce":
        c.error(f"{RC}.loss_type={c.get(f'{RC}.loss_type')} is bypass mode's loss and has no effect without it; set "
                f"{RC}.bypass_mode=True, or {RC}.loss_type=ppo_clip")


def _check_bypass(c, rollout_is) -> None:
    """bypass_mode replaces the policy loss (rlcore.algos.rollout_corr.bypass_mode_loss), as in verl."""
    mode = c.get("actor_rollout_ref.actor.policy_loss.loss_mode")
    if mode != "vanilla":
        c.error(f"{RC}.bypass_mode=True uses PPO's clipped loss (or loss_type=reinforce) in place of "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}; use loss_mode=vanilla, or bypass_mode=False")
    if rollout_is is not None and c.get(f"{RC}.loss_type") == "ppo_clip":
        c.error(f"{RC}.rollout_is={rollout_is} has no effect with bypass_mode and loss_type=ppo_clip (the PPO ratio to the "
                f"rollout policy already is the importance weight); use {RC}.loss_type=reinforce, or rollout_is=null")
    if c.get(f"{RC}.rollout_is_batch_normalize"):
        c.error(f"{RC}.rollout_is_batch_normalize=True: in bypass mode rlcore forms the IS weights per micro-batch, where a "
                f"batch mean would depend on the split; use {RC}.rollout_is_batch_normalize=False, or bypass_mode=False")
