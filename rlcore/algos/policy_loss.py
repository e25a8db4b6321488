"""Policy losses, registered by `actor.policy_loss.loss_mode`.

Each takes `old_log_prob`, `log_prob`, `advantages`, `response_mask` (all `[batch, response_len]`) and the
actor config, and returns `(loss_mat, metrics)`: the per-token loss `[batch, response_len]` (aggregated by
`rlcore.algos.agg`) and detached per-token statistics to aggregate the same way.
"""

from __future__ import annotations

import torch

from rlcore.algos.registry import Registry

POLICY_LOSSES = Registry("policy loss", "actor.policy_loss.loss_mode")


@POLICY_LOSSES.register("vanilla")
def vanilla_ppo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0):
    """PPO clip with dual clip (Ye et al. 2020).

    ratio r = exp(clamp(log_prob - old_log_prob, -20, 20))
    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high));  for A < 0 additionally L = min(L, -A c).
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_clip = torch.maximum(unclipped, clipped)
    loss_dual = torch.minimum(loss_clip, -advantages * clip_ratio_c)
    loss_mat = torch.where(advantages < 0, loss_dual, loss_clip)
    stats = {
        "actor/pg_clipfrac": (clipped > unclipped).float().detach(),
        "actor/pg_clipfrac_lower": ((loss_clip > -advantages * clip_ratio_c) & (advantages < 0)).float().detach(),
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return loss_mat, stats


@POLICY_LOSSES.register("gspo")
def gspo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, **_):
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, the geometric mean of the token ratios.

    log s_i = mean_t (log_prob - old_log_prob) over the response; every token uses
    s_{i,t} = exp(sg[log s_i] + log_prob_t - sg[log_prob_t]) (value s_i, gradient of its own token), clamped at
    log 10, then PPO clipping: L = max(-A s, -A clip(s, 1 - eps_low, 1 + eps_high)). No dual clip.
    """
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    token_log_ratio = (seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()).clamp(max=10.0)
    ratio = token_log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    stats = {
        "actor/pg_clipfrac": (clipped > unclipped).float().detach(),
        "actor/pg_clipfrac_lower": torch.zeros_like(ratio),
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return torch.maximum(unclipped, clipped), stats


@POLICY_LOSSES.register("gpg")
def gpg_loss(old_log_prob, log_prob, advantages, response_mask, **_):
    """GPG (Chu et al. 2025): plain policy gradient L = -A log_prob, no ratio and no clipping."""
    zeros = torch.zeros_like(log_prob)
    return -advantages * log_prob, {"actor/pg_clipfrac": zeros, "actor/pg_clipfrac_lower": zeros, "actor/ppo_kl": (old_log_prob - log_prob).detach()}
