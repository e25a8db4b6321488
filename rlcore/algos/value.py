"""The critic's math: clipped value loss and explained variance. All tensors `[batch, response_len]`."""

from __future__ import annotations

import torch


def clipped_value_loss(vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       cliprange_value: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, per token: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).

    The clip keeps one update from moving a value further than `critic.cliprange_value` from the value the
    advantages were computed with. Returns the per-token loss (aggregate with rlcore.algos.agg) and
    `critic/vf_clipfrac`, 1 where the clipped term is the larger (i.e. the clip removed the gradient).
    """
    clipped = old_values + (vpreds - old_values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss_mat = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    return loss_mat, {"critic/vf_clipfrac": (loss_clipped > loss_unclipped).float().detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] over the valid tokens: 1 = the critic predicts returns exactly, 0 = no better than
    their mean, < 0 = worse than a constant."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    return float(1.0 - (r - v).var(unbiased=False) / (r.var(unbiased=False) + 1e-8))
