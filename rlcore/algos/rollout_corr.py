"""Train-inference mismatch: measure it, and correct for it (verl's `algorithm.rollout_correction.*`).

The rollout engine samples with its own kernels and precision (vLLM, bf16, a KV cache), so its log-probs
`rollout_log_prob` differ from the trainer's `old_log_prob` for the same tokens and weights. The samples then come
from pi_rollout while the loss assumes pi_train: an off-policy gap that can grow until training collapses
(verl #2996). With the per-token log-ratio

    log_ratio = old_log_prob - rollout_log_prob = log(pi_train / pi_rollout)    [batch, response_len]

this module gives (all masked by `response_mask`, all returned under the `rollout_corr/` metric prefix):

- mismatch_metrics: the off-policy diagnostics, logged every step the rollout returns log-probs;
- rollout_is_weights: truncated importance sampling (TIS), the per-token factor the actor multiplies each token's
  policy loss by: w = min(rho, rollout_is_threshold), with rho per token (`token`) or the sequence's product
  (`sequence`, one weight for every token of the sequence); or, with a band "lower_upper" (verl 0.9), IcePop:
  w = rho inside the band and 0 outside;
- rollout_rs_mask: rejection sampling, a response mask without the tokens or whole sequences that one of the
  `rollout_rs` modes rejects (verl's `<aggregation>_<statistic>`, comma-separated: `token_k1,seq_max_k2`). A mode's
  per-token statistic (k1 = -log rho, k2 = (log rho)^2 / 2, k3 = rho - 1 - log rho) is judged per token or by its
  sequence's sum, mean or max; k1 against a ratio band, k2 and k3 against an upper bound (`rollout_rs_threshold`,
  one per mode, parsed by rlcore/config/algorithm_schema.py). rlcore's earlier `token`, `sequence` and
  `geometric` are token_k1, seq_sum_k1 and seq_mean_k1: with a number t, ratios outside [1/t, t] are rejected.

Ratios are formed in log space and exponentiated only after clamping to +-SAFETY_BOUND: a sequence product
of 100 tokens at ratio 2 would overflow float32.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from rlcore.algos.registry import Registry
from rlcore.config.algorithm_schema import RejectionRule, is_threshold_band, parse_rejection_rules

SAFETY_BOUND = 20.0  # |log ratio| cap before exp: e^20 ~ 4.9e8

# A level turns the per-token log-ratio [batch, response_len] into the log of the weight each token gets, of the
# same shape (a sequence level repeats one value over the sequence's tokens).
ROLLOUT_IS_LEVELS = Registry("rollout IS level", "algorithm.rollout_correction.rollout_is")
# Rejection (rollout_rs): a statistic turns the log-ratio into a per-token value [batch, response_len]; an aggregation
# turns per-token values into the value each token is judged by, of the same shape (a sequence aggregation repeats
# its value on every position of the row). A mode `<aggregation>_<statistic>` pairs them.
ROLLOUT_RS_STATISTICS = Registry("rollout RS statistic", "algorithm.rollout_correction.rollout_rs")
ROLLOUT_RS_AGGREGATIONS = Registry("rollout RS aggregation", "algorithm.rollout_correction.rollout_rs")
# rlcore's earlier rollout_rs names, kept: the k1 band at their level (token_k1, seq_sum_k1, seq_mean_k1)
ROLLOUT_RS_LEVELS = Registry("rollout RS level", "algorithm.rollout_correction.rollout_rs")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


@ROLLOUT_IS_LEVELS.register("token")
@ROLLOUT_RS_LEVELS.register("token")
@ROLLOUT_RS_AGGREGATIONS.register("token")
def token_level(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """v_t: each token its own value (IS: its own ratio log rho_t; biased, low variance)."""
    return values


@ROLLOUT_IS_LEVELS.register("sequence")
@ROLLOUT_RS_LEVELS.register("sequence")
@ROLLOUT_RS_AGGREGATIONS.register("seq_sum")
def sequence_level(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t v_t on every token (IS: sum_t log rho_t, the sequence's likelihood ratio prod_t rho_t; unbiased, high
    variance)."""
    return (values * mask).sum(-1, keepdim=True).expand_as(values)


@ROLLOUT_RS_LEVELS.register("geometric")
@ROLLOUT_RS_AGGREGATIONS.register("seq_mean")
def geometric_level(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mean_t v_t on every token (of log rho_t: the log of the ratios' geometric mean; length-independent)."""
    return masked_mean(values, mask, -1).unsqueeze(-1).expand_as(values)


@ROLLOUT_RS_AGGREGATIONS.register("seq_max")
def sequence_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max_t v_t on every token, 0 for an empty sequence: one spiking token rejects its sequence."""
    top = values.masked_fill(mask == 0, float("-inf")).amax(-1, keepdim=True)
    return torch.where(mask.sum(-1, keepdim=True) > 0, top, torch.zeros_like(top)).expand_as(values)


@ROLLOUT_RS_STATISTICS.register("k1")
def k1_statistic(log_ratio: torch.Tensor) -> torch.Tensor:
    """-log rho = log(pi_rollout / pi_train), the k1 estimate of KL(pi_rollout || pi_train) (signed)."""
    return -log_ratio


@ROLLOUT_RS_STATISTICS.register("k2")
def k2_statistic(log_ratio: torch.Tensor) -> torch.Tensor:
    """(log rho)^2 / 2 (>= 0, symmetric in log rho)."""
    return 0.5 * log_ratio.square()


@ROLLOUT_RS_STATISTICS.register("k3")
def k3_statistic(log_ratio: torch.Tensor) -> torch.Tensor:
    """rho - 1 - log rho (>= 0, 0 at rho = 1), the k3 estimate of KL(pi_rollout || pi_train)."""
    return log_ratio.exp() - 1 - log_ratio


def mismatch_token_terms(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, threshold: float) -> dict[str, torch.Tensor]:
    """Per-token terms `[batch, response_len]` whose token mean is a mismatch metric (so the actor can aggregate
    them over micro-batches and ranks exactly, as it does its loss):

    kl = rollout - train (k1 estimate of KL(rollout || train)); k3_kl = rho - log rho - 1 (k3, >= 0);
    log_ratio_mean = log rho; chi2_token = rho^2 - 1; ratio_fraction_high / _low = 1 where rho > threshold /
    rho < 1 / threshold (the share of tokens a truncation or rejection at that threshold would touch).
    """
    log_ratio = (log_prob - rollout_log_prob).detach()
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    log_threshold = math.log(threshold)
    return {
        "kl": -log_ratio,
        "k3_kl": rho - log_ratio - 1,
        "log_ratio_mean": log_ratio,
        "chi2_token": rho.square() - 1,
        "ratio_fraction_high": (log_ratio > log_threshold).float(),
        "ratio_fraction_low": (log_ratio < -log_threshold).float(),
    }


def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                     threshold: float) -> dict[str, float]:
    """verl's off-policy diagnostics of the whole batch plus rlcore's log-ratio extremes, keys without the prefix.

    Token means: see mismatch_token_terms. Per sequence s with mean log-probs lp_train(s), lp_rollout(s):
    training_ppl = mean_s exp(-lp_train(s)) (rollout_ppl alike, *_log_ppl without the exp);
    log_ppl_diff = mean_s (lp_rollout(s) - lp_train(s)) (also abs / max / min over s); ppl_ratio =
    mean_s exp(lp_rollout(s) - lp_train(s)); chi2_seq = mean_s exp(2 sum_t log rho) - 1;
    log_ratio_abs_max = max_t |log rho| (the worst single token).
    """
    mask = response_mask.to(old_log_prob.dtype)
    metrics = {k: masked_mean(v, mask).item() for k, v in mismatch_token_terms(old_log_prob, rollout_log_prob, threshold).items()}
    log_ratio = old_log_prob - rollout_log_prob
    rows = mask.sum(-1) > 0  # an empty response has no perplexity
    train_lp, rollout_lp = masked_mean(old_log_prob, mask, -1)[rows], masked_mean(rollout_log_prob, mask, -1)[rows]
    diff = rollout_lp - train_lp
    seq_log_ratio = (log_ratio * mask).sum(-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics.update({
        "training_ppl": (-train_lp).exp().mean().item(), "training_log_ppl": (-train_lp).mean().item(),
        "rollout_ppl": (-rollout_lp).exp().mean().item(), "rollout_log_ppl": (-rollout_lp).mean().item(),
        "log_ppl_diff": diff.mean().item(), "log_ppl_abs_diff": diff.abs().mean().item(),
        "log_ppl_diff_max": diff.max().item(), "log_ppl_diff_min": diff.min().item(),
        "ppl_ratio": diff.exp().mean().item(),
        "chi2_seq": (2 * seq_log_ratio).exp().mean().item() - 1,
        "log_ratio_abs_max": (log_ratio.abs() * mask).max().item(),
    })
    return metrics


def rollout_is_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, threshold: Union[str, float],
                       batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights `[batch, response_len]` (0 on padding, detached) from rho = exp(log_w), log_w from the level:
    truncated, w = min(rho, threshold) for a number (TIS); for verl 0.9's band "lower_upper", w = rho inside
    [lower, upper] and 0 outside (IcePop: a token far off-policy drops out rather than counting at the cap).
    Metrics describe the weights before truncation (verl's rollout_is_*): mean, max, min, the share past the upper
    bound / below the lower one (1 / threshold for a number), the effective sample size 1 / mean((v / mean v)^2) of
    v = rho clamped to those bounds, and for a band the share outside it (rollout_is_oob_ratio). batch_normalize
    divides by the batch's mean weight (over tokens for `token`, over non-empty sequences for `sequence`) so the
    weights average 1; the factor is logged."""
    lower, upper, problems = is_threshold_band(threshold)
    if problems:
        raise ValueError(problems[0])
    mask = response_mask.to(log_ratio.dtype)
    log_w = ROLLOUT_IS_LEVELS.get(level)(log_ratio.detach(), mask)
    raw = log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask
    valid = mask.bool()
    low = 1 / upper if lower is None else lower
    clamped = raw.clamp(low, upper)
    metrics = {
        "rollout_is_mean": masked_mean(raw, mask).item(),
        "rollout_is_max": raw[valid].max().item(), "rollout_is_min": raw[valid].min().item(),
        "rollout_is_ratio_fraction_high": masked_mean((log_w > math.log(upper)).float(), mask).item(),
        "rollout_is_ratio_fraction_low": masked_mean((log_w < math.log(low)).float(), mask).item(),
        "rollout_is_eff_sample_size": 1 / masked_mean((clamped / masked_mean(clamped, mask)).square(), mask).item(),
    }
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        inside = (raw >= lower) & (raw <= upper)
        weights = torch.where(inside, raw, torch.zeros_like(raw))
        metrics["rollout_is_oob_ratio"] = masked_mean((~inside).float(), mask).item()
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:  # every token of a sequence has its weight: average one per non-empty sequence
            rows = mask.sum(-1) > 0
            mean = masked_mean(weights, mask, -1)[rows].mean()
        metrics["rollout_is_batch_norm_factor"] = mean.item()
        weights = weights / mean if mean > 1e-8 else weights
    return weights, metrics


def rejection_verdicts(log_ratio: torch.Tensor, response_mask: torch.Tensor, rules: list[RejectionRule]
                       ) -> tuple[torch.Tensor, list[tuple[RejectionRule, torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """(the response mask without the rejected tokens, (rule, value, high, low) per rule), all `[batch,
    response_len]`, without a host sync. value: the rule's statistic of log rho (clamped to +-SAFETY_BOUND) under its
    aggregation; high / low: value above the rule's upper bound / below its lower one (k1: the logs of the band, as
    k1 = log(pi_rollout / pi_train)); bounds are inclusive. A token stays where no rule rejects it."""
    mask = response_mask.to(log_ratio.dtype)
    log_ratio = log_ratio.detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    kept, verdicts = mask, []
    for rule in rules:
        value = ROLLOUT_RS_AGGREGATIONS.get(rule.aggregation)(ROLLOUT_RS_STATISTICS.get(rule.statistic)(log_ratio), mask)
        if rule.statistic == "k1":
            high, low = value > math.log(rule.upper), value < math.log(rule.lower)
        else:
            high, low = value > rule.upper, torch.zeros_like(value, dtype=torch.bool)
        kept = kept * ~(high | low)
        verdicts.append((rule, value, high, low))
    return response_mask * kept.to(response_mask.dtype), verdicts


def rollout_rs_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str,
                    threshold: Union[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask without the tokens that a `rollout_rs` mode rejects (rejection_verdicts), and metrics:
    the share of tokens rejected (rollout_rs_masked_fraction) and of sequences that lost one
    (rollout_rs_seq_masked_fraction); per mode, as verl names them (rollout_rs_<mode>_*), the value's token mean,
    max and min, the share above the upper bound (fraction_high; k1: below the band too, fraction_low), counted in
    tokens for token_* modes and in sequences for seq_* ones, and the shares that mode alone rejects."""
    mask = response_mask.to(log_ratio.dtype)
    kept, verdicts = rejection_verdicts(log_ratio, response_mask, parse_rejection_rules(rollout_rs, threshold))
    valid, rows = mask.bool(), mask.sum(-1) > 0
    rejected = mask - kept.to(mask.dtype)
    metrics = {
        "rollout_rs_masked_fraction": masked_mean(rejected, mask).item(),
        "rollout_rs_seq_masked_fraction": (rejected.sum(-1)[rows] > 0).float().mean().item(),
    }
    for rule, value, high, low in verdicts:
        by_sequence = rule.aggregation != "token"
        share = (lambda flags: flags[:, 0][rows].float().mean()) if by_sequence else (lambda flags: masked_mean(flags.float(), mask))
        rule_rejected = (high | low).to(mask.dtype) * mask
        prefix = f"rollout_rs_{rule.mode}"
        metrics.update({
            f"{prefix}_mean": masked_mean(value, mask).item(),
            f"{prefix}_max": value[valid].max().item() if valid.any() else 0.0,
            f"{prefix}_min": value[valid].min().item() if valid.any() else 0.0,
            f"{prefix}_fraction_high": share(high).item(),
            f"{prefix}_masked_fraction": masked_mean(rule_rejected, mask).item(),
            f"{prefix}_seq_masked_fraction": (rule_rejected.sum(-1)[rows] > 0).float().mean().item(),
        })
        if rule.statistic == "k1":
            metrics[f"{prefix}_fraction_low"] = share(low).item()
    return kept, metrics


def rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       rollout_is: Optional[str], rollout_is_threshold: Union[str, float], rollout_rs: Optional[str],
                       rollout_rs_threshold: Union[str, float, None], rollout_is_batch_normalize: bool = False
                       ) -> tuple[Optional[torch.Tensor], torch.Tensor, dict[str, float]]:
    """(IS weights or None, the response mask after rejection, `rollout_corr/*` metrics) of a batch: verl's
    decoupled mode, old_log_prob from the trainer's pass over the rollout's samples. Rejection and the weights
    are both computed from the batch as sampled; the mismatch metrics cover every token (before rejection)."""
    log_ratio = old_log_prob - rollout_log_prob
    metrics = mismatch_metrics(old_log_prob, rollout_log_prob, response_mask, is_threshold_band(rollout_is_threshold)[1])
    weights = None
    if rollout_is is not None:
        weights, is_metrics = rollout_is_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    mask = response_mask
    if rollout_rs is not None:
        mask, rs_metrics = rollout_rs_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def bypass_mode_loss(rollout_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                     loss_type: str, rollout_is: Optional[str], rollout_is_threshold: Union[str, float], rollout_rs: Optional[str],
                     rollout_rs_threshold: Union[str, float, None], rollout_is_batch_normalize: bool = False,
                     **clip) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """verl's bypass mode (old = rollout policy, no old-log-prob pass): (loss_mat, kept mask, per-token stats),
    all `[batch, response_len]`, the loss already zero on rejected tokens.

    The ratio rho = pi_theta / pi_rollout is this forward's (detached), so rejection (rollout_rs) and the IS weights
    (rollout_is) follow the policy as the update moves it.
    - ppo_clip: PPO's clipped surrogate (vanilla, dual clip; `clip` = clip_ratio_low/high/c) with r = rho: the
      ratio already is the importance weight, so no IS weight is applied on top.
    - reinforce: L = -A w log pi_theta with w = the truncated IS weight (detached; 1 with rollout_is=null), whose
      gradient is -A w grad log pi: the IS-corrected policy gradient. `rollout_is_batch_normalize` divides w by its
      mean over this micro-batch (verl forms the weights inside its loss too, and divides by the micro-batch's mean
      over every data-parallel rank: equal at one rank; rlcore's loss functions hold no collective).
    """
    from rlcore.algos.policy_loss import vanilla_ppo_loss  # policy_loss does not import this module: no cycle

    log_ratio = log_prob.detach() - rollout_log_prob
    kept = response_mask
    if rollout_rs is not None:
        # the mask only: metrics here would cost a host sync per micro-batch (the actor logs the masked share)
        kept, _ = rejection_verdicts(log_ratio, response_mask, parse_rejection_rules(rollout_rs, rollout_rs_threshold))
    if loss_type == "ppo_clip":
        loss_mat, stats = vanilla_ppo_loss(rollout_log_prob, log_prob, advantages, kept, **clip)
    elif loss_type == "reinforce":
        weights = 1.0
        if rollout_is is not None:
            weights, _ = rollout_is_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        loss_mat = -advantages * weights * log_prob
        zeros = torch.zeros_like(log_prob)
        stats = {"actor/pg_clipfrac": zeros, "actor/pg_clipfrac_lower": zeros, "actor/ppo_kl": -log_ratio}
    else:
        raise ValueError(f"unknown algorithm.rollout_correction.loss_type={loss_type!r}; valid: ppo_clip, reinforce")
    return loss_mat * kept, kept, stats
