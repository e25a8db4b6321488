"""The optimal token baseline (OTB): a per-token baseline for each prompt's group that weighs every sample's
reward-to-go by how much gradient its path has carried so far. verl's `algorithm.adv_estimator=optimal_token_baseline`
and, for multi-turn rows whose response holds tool tokens, `tir_optimal_token_baseline`.

The variance of the policy gradient at token t scales with the squared norm of the score d log pi(y_t) / dz, which
for a softmax is 1 - 2 pi(y_t) + sum_v pi(v)^2. Summed along the path, W_t = sum_{j <= t} that norm (times the
rollout IS weight squared, when there is one), the baseline that minimises the variance is B_t = E[G_t W_t] / E[W_t]
over the group, and A_t = G_t - B_t with G_t the reward-to-go. sum_v pi(v)^2 comes from the old-log-prob pass
(actor.calculate_sum_pi_squared, rlcore.models.logits); the estimator itself is pure tensor math.
"""

from __future__ import annotations

import numpy as np
import torch

from rlcore.algos.advantages import ADV_ESTIMATORS, group_indices


def score_norms(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None = None) -> torch.Tensor:
    """||d log pi(y_t) / dz||^2 = 1 - 2 pi(y_t) + sum_v pi(v)^2 per token, times the IS weight squared if given."""
    norms = 1.0 - 2.0 * old_log_probs.exp() + sum_pi_squared
    return norms * rollout_is_weights**2 if rollout_is_weights is not None else norms


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{j >= t} r_j over the response's tokens."""
    return (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)


def _baselines(returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, index: np.ndarray, zero_tail: bool,
               epsilon: float) -> torch.Tensor:
    """B_t = sum_i G_it W_it / sum_i W_it over each group's samples valid at t (0 for a group of one). `zero_tail`:
    where one sample is the group's longest by itself, its tokens past the second longest get no baseline (an average
    over one sample is that sample: its advantage there would be 0)."""
    baselines = torch.zeros_like(returns)
    lengths = mask.sum(-1)
    for rows in group_indices(index).values():
        if len(rows) < 2:
            continue
        w = weights[rows] * mask[rows]
        baselines[rows] = (returns[rows] * w).sum(0) / (w.sum(0) + epsilon)
        if zero_tail:
            longest, second = lengths[rows].topk(2).values.tolist()
            if longest > second:
                baselines[rows[int(lengths[rows].argmax())], int(second):] = 0.0
    return baselines


@ADV_ESTIMATORS.register("optimal_token_baseline")
def optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                     old_log_probs: torch.Tensor | None = None, sum_pi_squared: torch.Tensor | None = None,
                                     rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = False,
                                     epsilon: float = 1e-8, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A_t = G_t - B_t with the module's baseline, by response position. Returns (advantages, reward-to-go)."""
    _require(old_log_probs, sum_pi_squared)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = reward_to_go(token_level_rewards, mask)
        path = (score_norms(old_log_probs, sum_pi_squared, rollout_is_weights) * mask).cumsum(-1)
        baselines = _baselines(returns, path, mask, index, handle_zero_tail, epsilon)
        return (returns - baselines) * mask, returns


@ADV_ESTIMATORS.register("tir_optimal_token_baseline")
def tool_integrated_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                     index: np.ndarray, old_log_probs: torch.Tensor | None = None,
                                                     sum_pi_squared: torch.Tensor | None = None,
                                                     rollout_is_weights: torch.Tensor | None = None,
                                                     handle_zero_tail: bool = True, epsilon: float = 1e-8,
                                                     **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The same, by the policy's own tokens: a multi-turn response interleaves the policy's tokens with tool output
    (mask 0), so the k-th baseline averages the samples' k-th generated tokens, wherever each one sits in its row."""
    _require(old_log_probs, sum_pi_squared)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = reward_to_go(token_level_rewards, mask)
        path = (score_norms(old_log_probs, sum_pi_squared, rollout_is_weights) * mask).cumsum(-1)
        rows, cols = response_mask.nonzero(as_tuple=True)
        ordinal = (response_mask.long().cumsum(-1) - 1)[rows, cols]  # k: the token's place among its row's own
        width = int(ordinal.max()) + 1 if len(ordinal) else 0
        packed = lambda x: x.new_zeros(len(x), width).index_put_((rows, ordinal), x[rows, cols])  # noqa: E731
        packed_mask = packed(mask)
        baselines = _baselines(packed(returns), packed(path), packed_mask, index, handle_zero_tail, epsilon)
        advantages = torch.zeros_like(returns)
        advantages[rows, cols] = (packed(returns) - baselines)[rows, ordinal]
        return advantages, returns


def variance_proxy_metrics(advantages: torch.Tensor, response_mask: torch.Tensor, old_log_probs: torch.Tensor,
                           sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None = None,
                           grad_norm: float | None = None) -> dict[str, float]:
    """verl's `variance_proxy/*` (logged whenever the batch has sum_pi_squared, whatever the estimator): how noisy
    the step's policy gradient is, from E[||g_i||^2] ~ E[A_i^2 W_i] with W_i the sample's summed score norm and A_i
    its mean advantage. proxy1 = ||g||^2 (the update's grad norm squared), proxy2 = E[||g_i||^2] (with IS weights:
    E[rho_i^2 A_i^2 W_i] over the unweighted norms), proxy3 = (proxy2 - proxy1) / (N - 1), the variance of the
    batch's mean gradient (0 without a grad norm)."""
    mask = response_mask.to(advantages.dtype)
    tokens = mask.sum(-1).clamp(min=1)
    mean_advantage = (advantages * mask).sum(-1) / tokens
    norms = score_norms(old_log_probs, sum_pi_squared, rollout_is_weights)
    path = (norms * mask).sum(-1)
    if rollout_is_weights is not None:
        unweighted = (norms / (rollout_is_weights**2).clamp(min=1e-10) * mask).sum(-1).clamp(min=0.0)
        rho = (rollout_is_weights * mask).sum(-1) / tokens
        total_power = (rho**2 * mean_advantage**2 * unweighted).mean().item()
    else:
        total_power = (mean_advantage**2 * path.clamp(min=0.0)).mean().item()
    signal = grad_norm**2 if grad_norm is not None else None
    samples = len(mean_advantage)
    noise = max(0.0, (total_power - signal) / (samples - 1)) if signal is not None and samples > 1 else 0.0
    return {"variance_proxy/proxy1_signal_strength": signal or 0.0, "variance_proxy/proxy2_total_power": total_power,
            "variance_proxy/proxy3_pure_noise": noise, "variance_proxy/expected_a_squared": (mean_advantage**2).mean().item(),
            "variance_proxy/expected_w": path.mean().item()}


def _require(old_log_probs, sum_pi_squared) -> None:
    if old_log_probs is None or sum_pi_squared is None:  # validation refuses the configs that lead here
        raise ValueError("the optimal token baseline needs the old-log-prob pass's old_log_probs and sum_pi_squared: set "
                         "actor_rollout_ref.actor.calculate_sum_pi_squared=True (and keep rollout_correction.bypass_mode=False)")
