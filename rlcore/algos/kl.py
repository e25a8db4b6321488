"""KL estimators between the current policy and a reference, per token, and KL-coefficient controllers.

All functions take log-probs of the sampled tokens, shapes `[batch, response_len]`, and return the same shape.
"""

from __future__ import annotations

import torch

from rlcore.algos.registry import Registry
from rlcore.config import names

KL_ESTIMATORS = Registry("KL estimator", "kl_loss_type / algorithm.kl_penalty", names.KL_ESTIMATORS)


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log ref (unbiased, high variance, can be negative)."""
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """|log pi - log ref|."""
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi - log ref)^2."""
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log ref - log pi) - (log ref - log pi) - 1 >= 0 (Schulman's low-variance estimator), clamped to [-10, 10]."""
    log_ratio = (ref_log_prob - log_prob).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


def _straight_through_k2(estimator):
    def plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        """Forward value of the named estimator, gradient of k2 (unbiased gradient of KL)."""
        value = estimator(log_prob, ref_log_prob)
        k2 = kl_k2(log_prob, ref_log_prob)
        return k2 - k2.detach() + value.detach()

    return plus


for _name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
    KL_ESTIMATORS.register(_name + "+")(_straight_through_k2(KL_ESTIMATORS.get(_name)))


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str) -> torch.Tensor:
    return KL_ESTIMATORS.get(kl_type)(log_prob, ref_log_prob)


class FixedKLController:
    """Constant coefficient beta."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. (2019): beta *= 1 + clip(kl/target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kl_ctrl) -> FixedKLController | AdaptiveKLController:
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type={kl_ctrl.type!r}; valid: adaptive, fixed")
