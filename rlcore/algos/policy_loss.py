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
def vanilla_ppo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, **_):
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


@POLICY_LOSSES.register("geo_mean")
def geo_mean_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, **_):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): PPO on the geometric mean of a sequence's token ratios.

    Per token d = log_prob - old_log_prob, clipped in log space on the side the advantage's sign makes pessimistic:
    d' = sign(A) min(sign(A) d, sign(A) clip(d, -eps_low, eps_high)). Per sequence r_i = exp(mean_t d'),
    A_i = mean_t A and L_i = -A_i r_i. A loss per sequence: every token carries L_i and the sequences are averaged
    (GMPO_AGGREGATION), whatever actor.loss_agg_mode says, as verl's geo_mean ignores it.
    """
    mask = response_mask.to(log_prob.dtype)
    tokens = mask.sum(-1).clamp(min=1)
    log_ratio = log_prob - old_log_prob
    clipped_log_ratio = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    sign = advantages.sign()
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    ratio = ((pessimistic * mask).sum(-1) / tokens).exp()
    advantage = (advantages * mask).sum(-1) / tokens
    loss = (-advantage * ratio).unsqueeze(-1).expand_as(log_prob)
    outside = (log_ratio != clipped_log_ratio).float()
    stats = {
        "actor/pg_clipfrac": (outside * (advantages > 0)).detach(),
        "actor/pg_clipfrac_lower": (outside * (advantages < 0)).detach(),
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return loss, stats


GMPO_AGGREGATION = "seq-mean-token-mean"  # the mean over sequences of a loss every token of a sequence shares
geo_mean_loss.loss_agg_mode = GMPO_AGGREGATION


@POLICY_LOSSES.register("cispo")
def cispo_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, **_):
    """CISPO (MiniMax-M1, 2025): clip the importance weight, never the gradient.

    L = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A log_prob: REINFORCE weighted by the truncated ratio, so tokens
    whose ratio leaves the trust region still contribute a (bounded) gradient, unlike PPO where they get none.
    eps are actor.clip_ratio_low / clip_ratio_high; pg_clipfrac counts tokens whose weight was truncated.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    stats = {
        "actor/pg_clipfrac": (ratio > 1.0 + clip_ratio_high).float().detach(),
        "actor/pg_clipfrac_lower": (ratio < 1.0 - clip_ratio_low).float().detach(),
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return -advantages * weight * log_prob, stats


@POLICY_LOSSES.register("sapo")
def sapo_loss(old_log_prob, log_prob, advantages, response_mask, tau_pos=1.0, tau_neg=1.05, **_):
    """SAPO (Gao et al. 2025, arXiv 2511.20347): a smooth gate on the ratio instead of a hard clip.

    r = exp(clamp(log_prob - old_log_prob, -20, 20)); per token L = -A f(r) with the gate
    f(r) = (4 / tau) sigmoid(tau (r - 1)), tau = tau_pos where A > 0, else tau_neg. At r = 1 the gate's slope is 1,
    as PPO's ratio's; away from it the gradient fades instead of dropping to zero at a clip edge. A loss averaged
    per sequence (SAPO_AGGREGATION), whatever actor.loss_agg_mode says, as verl's sapo does. Nothing is clipped:
    pg_clipfrac is 0.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    tau = torch.where(advantages > 0, torch.tensor(tau_pos, dtype=log_prob.dtype, device=log_prob.device),
                      torch.tensor(tau_neg, dtype=log_prob.dtype, device=log_prob.device))
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    zeros = torch.zeros_like(log_prob)
    return -advantages * gate, {"actor/pg_clipfrac": zeros, "actor/pg_clipfrac_lower": zeros, "actor/ppo_kl": (-log_ratio).detach()}


SAPO_AGGREGATION = "seq-mean-token-mean"
sapo_loss.loss_agg_mode = SAPO_AGGREGATION


def _token_covariance(advantages, log_prob, mask):
    """Per-token centred product (A - mean A)(log_prob - mean log_prob), means over the valid tokens of the
    micro-batch (log_prob detached in the mean) — the covariance term that drives entropy collapse (Cui et al. 2025)."""
    m = mask.to(log_prob.dtype)
    count = m.sum().clamp(min=1)
    mean_adv = (advantages * m).sum() / count
    mean_logp = (log_prob.detach() * m).sum() / count
    return (advantages - mean_adv) * (log_prob.detach() - mean_logp)


@POLICY_LOSSES.register("clip_cov")
def clip_cov_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2,
                  clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, **_):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs").

    PPO clip L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), then among the valid tokens PPO did NOT clip
    whose covariance lies in (clip_cov_lb, clip_cov_ub), max(1, clip_cov_ratio * valid tokens) are drawn at random
    and their loss is zeroed (no gradient). Selection is per micro-batch, as in verl.
    pg_clipfrac = fraction of tokens whose gradient was removed by either rule.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_clipped = (clipped > unclipped) & response_mask.bool()
    cov = _token_covariance(advantages, log_prob, response_mask)
    eligible = (cov > clip_cov_lb) & (cov < clip_cov_ub) & response_mask.bool() & ~ppo_clipped
    candidates = eligible.flatten().nonzero().squeeze(-1)
    n_clip = max(int(clip_cov_ratio * float(response_mask.sum())), 1)
    chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:n_clip]]
    keep = torch.ones_like(ratio).flatten()
    keep[chosen] = 0.0
    keep = keep.view_as(ratio)
    loss_mat = torch.maximum(unclipped, clipped) * keep
    stats = {
        "actor/pg_clipfrac": (ppo_clipped | (keep == 0)).float().detach(),
        "actor/pg_clipfrac_lower": torch.zeros_like(ratio),
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return loss_mat, stats


@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio=0.0002, ppo_kl_coef=0.1, **_):
    """KL-Cov (Cui et al. 2025): unclipped surrogate -A r, plus ppo_kl_coef * |log_prob - old_log_prob| on the
    int(kl_cov_ratio * valid tokens) valid tokens of largest covariance (none when that count is 0). Per micro-batch.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss_mat = -advantages * ratio
    k = int(kl_cov_ratio * float(response_mask.sum()))
    if k > 0:
        cov = _token_covariance(advantages, log_prob, response_mask).masked_fill(~response_mask.bool(), float("-inf"))
        top = cov.flatten().topk(k).indices
        penalty = torch.zeros_like(ratio).flatten()
        penalty[top] = 1.0
        loss_mat = loss_mat + ppo_kl_coef * (log_prob - old_log_prob).abs() * penalty.view_as(ratio)
    zeros = torch.zeros_like(ratio)
    return loss_mat, {"actor/pg_clipfrac": zeros, "actor/pg_clipfrac_lower": zeros, "actor/ppo_kl": (-log_ratio).detach()}


def _dppo_loss(old_log_prob, log_prob, advantages, trusted, clip_ratio_c):
    """DPPO's shared body: L = -A sg[min(r, c)] log_prob sg[m] `[batch, response_len]`, m = `trusted` (0/1, the
    variant's trust region).

    Instead of PPO's clip (whose ratio test over-penalises rare tokens and under-penalises frequent ones) the mask
    drops a token only when its probability moved too far in the direction its advantage pushes; the truncated ratio
    (clip_ratio_c, verl's TIS in place of dual clip) keeps the kept tokens' weights bounded.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    weight = ratio.clamp(max=clip_ratio_c).detach()
    keep = trusted.detach().to(log_prob.dtype)
    stats = {
        "actor/pg_clipfrac": (1.0 - keep).detach(),  # tokens outside the trust region
        "actor/pg_clipfrac_lower": ((ratio > clip_ratio_c).to(log_prob.dtype) * keep).detach(),  # kept, ratio truncated
        "actor/ppo_kl": (-log_ratio).detach(),
    }
    return -advantages * weight * log_prob * keep, stats


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, **_):
    """DPPO-Binary-TV (Qi et al. 2026, arXiv 2602.04879): a trust region on the probability itself.

    p = exp(log_prob), p_old = exp(old_log_prob) `[batch, response_len]`; a token is kept where
    A > 0: p - p_old <= delta_high,  else: p - p_old >= -delta_low
    (delta = actor.clip_ratio_low / clip_ratio_high, here total-variation thresholds, not ratio bounds: verl's script
    uses 0.15), and L = -A sg[min(r, clip_ratio_c)] log_prob on the kept tokens, 0 elsewhere.
    """
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)
    trusted = torch.where(advantages > 0, moved <= clip_ratio_high, moved >= -clip_ratio_low)
    return _dppo_loss(old_log_prob, log_prob, advantages, trusted, clip_ratio_c)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, **_):
    """DPPO-Binary-KL (Qi et al. 2026): the trust region in the KL of the token's binary distribution {a, not a}.

    D = p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)) `[batch, response_len]`;
    a token is kept where A > 0: D <= delta_high or p <= p_old,  else: D <= delta_low or p >= p_old
    (only a move in the direction the advantage pushes is bounded; verl's script uses delta = 0.05), and
    L = -A sg[min(r, clip_ratio_c)] log_prob on the kept tokens, 0 elsewhere.
    """
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    trusted = torch.where(advantages > 0, (binary_kl <= clip_ratio_high) | (p <= p_old), (binary_kl <= clip_ratio_low) | (p >= p_old))
    return _dppo_loss(old_log_prob, log_prob, advantages, trusted, clip_ratio_c)


@POLICY_LOSSES.register("dro")
def dro_loss(old_log_prob, log_prob, advantages, response_mask, dro_beta=None, **_):
    """DRO (Direct Reward Optimisation, Richemond et al. 2024), verl's form: a policy gradient with a quadratic
    penalty on the log-ratio instead of a clip.

    L = -(A log_prob - beta / 2 (log_prob - old_log_prob)^2) per token `[batch, response_len]`, beta =
    actor.policy_loss.dro_beta > 0 (the validator refuses a missing one). No ratio clamp; only actor/ppo_kl is logged.
    """
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.dro_beta={dro_beta} must be > 0 with loss_mode=dro")
    log_ratio = log_prob - old_log_prob
    return -(advantages * log_prob - 0.5 * dro_beta * log_ratio.square()), {"actor/ppo_kl": (-log_ratio).detach()}
