"""Rules for the optimal token baseline (`algorithm.adv_estimator=optimal_token_baseline` and its multi-turn form;
rlcore/algos/otb.py). `c` is validate's checker (get / error)."""

from __future__ import annotations

OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
SUM_PI_SQUARED = "actor_rollout_ref.actor.calculate_sum_pi_squared"


def check_otb(c) -> None:
    estimator = c.get("algorithm.adv_estimator")
    if estimator not in OTB_ESTIMATORS:
        return
    if not c.get(SUM_PI_SQUARED):
        c.error(f"algorithm.adv_estimator={estimator} weighs each token by 1 - 2 pi + sum pi^2, and the sum comes from the "
                f"old-log-prob pass only when {SUM_PI_SQUARED}=True; set it (verl's OTB scripts do)")
    if c.get("algorithm.rollout_correction.bypass_mode"):
        c.error(f"algorithm.adv_estimator={estimator} needs the old-log-prob pass (its log-probs and sum pi^2), which "
                "algorithm.rollout_correction.bypass_mode=True skips; use bypass_mode=False")
