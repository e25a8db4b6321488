"""Rules for PF-PPO (`algorithm.use_pf_ppo`, `algorithm.pf_ppo.*`; rlcore/algos/pf_ppo.py). `c` is validate's
checker (get / error / choice)."""

from __future__ import annotations

REWEIGHT_METHODS = ("pow", "max_min", "max_random")


def check_pf_ppo(c) -> None:
    if not c.get("algorithm.use_pf_ppo"):
        return
    c.choice("algorithm.pf_ppo.reweight_method", REWEIGHT_METHODS)
    estimator = c.get("algorithm.adv_estimator")
    if estimator != "gae":
        # verl redraws the batch inside its GAE branch only: elsewhere the key would be accepted and do nothing
        c.error(f"algorithm.use_pf_ppo=True redraws the batch after GAE (verl's PF-PPO is part of its GAE path), so with "
                f"algorithm.adv_estimator={estimator} it would do nothing; use algorithm.adv_estimator=gae or drop use_pf_ppo")
