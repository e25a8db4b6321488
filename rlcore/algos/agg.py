"""Loss aggregation (`actor.loss_agg_mode`) that stays exact under gradient accumulation and data parallelism.

A mini-batch is processed as several micro-batches on several ranks. Each micro-batch returns its share of the
mini-batch loss, normalised by mini-batch-wide counts (`global_tokens`, `global_seqs`, summed over micro-batches
and ranks), times `dp_size` because data-parallel gradient reduction averages over ranks. Summing the shares
over micro-batches and averaging over ranks then gives exactly the loss of the whole mini-batch in one piece.

Rejected tokens (algorithm.rollout_correction.rollout_rs) are absent from the mask, so they are as if never
sampled, as in verl: out of the token count, and a sequence without a valid token is out of the sequence count
(verl's agg_loss "excludes fully masked sequences" since its rollout-correction rework). Both counts are clamped at 1
where they divide: a micro-batch, or a whole mini-batch, without a valid token then contributes exactly 0 (verl's
masked_mean adds 1e-8 to the same end) instead of 0/0 = NaN, which would poison every micro-batch's gradient in
the accumulation. A mini-batch with no valid token at all is not stepped on (rlcore.workers.common.run_ppo_updates).
"""

from __future__ import annotations

import torch

from rlcore.algos.registry import Registry
from rlcore.config import names

LOSS_AGGREGATIONS = Registry("loss aggregation", "actor.loss_agg_mode", names.LOSS_AGG_MODES)


@LOSS_AGGREGATIONS.register("token-mean")
def _token_mean(loss_mat, mask, global_tokens, global_seqs, horizon):
    """sum over all valid tokens / number of valid tokens in the mini-batch."""
    return (loss_mat * mask).sum() / global_tokens


@LOSS_AGGREGATIONS.register("token-sum")
def _token_sum(loss_mat, mask, global_tokens, global_seqs, horizon):
    """sum over all valid tokens of the mini-batch, no normaliser (verl 0.9): each micro-batch's share is its own
    token sum, and agg_loss's dp_size factor undoes the data-parallel gradient mean, so the shares add up to the
    mini-batch's sum. The loss (and the gradient) grows with the number of tokens: scale the lr accordingly."""
    return (loss_mat * mask).sum()


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat, mask, global_tokens, global_seqs, horizon):
    """mean over sequences of the per-sequence token sum."""
    return (loss_mat * mask).sum() / global_seqs


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat, mask, global_tokens, global_seqs, horizon):
    """mean over sequences of the per-sequence token mean."""
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / global_seqs


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat, mask, global_tokens, global_seqs, horizon):
    """Dr. GRPO: token sums divided by a constant horizon (max response length), averaged over sequences."""
    return (loss_mat * mask).sum() / (global_seqs * horizon)


def statistic_mode(loss_agg_mode: str) -> str:
    """How a loss's per-token statistics (clip fractions, ppo_kl, value means) aggregate: as the loss does, except
    under token-sum, whose sum would turn an average into a count that grows with the batch: there a token mean
    (verl logs them as masked means whatever the aggregation)."""
    return "token-mean" if loss_agg_mode == "token-sum" else loss_agg_mode


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    dp_size: int = 1,
    loss_scale_factor: int | None = None,
) -> torch.Tensor:
    """Aggregates `loss_mat` `[batch, response_len]` over `mask` (same shape, 0/1) into a scalar.

    Without global counts this is the plain loss of this batch alone. Counts as mini_batch_counts gives them: valid
    tokens, and sequences with at least one valid token. `loss_scale_factor` (verl 0.9's `<role>.loss_scale_factor`):
    seq-mean-token-sum-norm's divisor; None = response_len, the batch's response width.
    """
    mask = mask.to(loss_mat.dtype)
    global_tokens = mask.sum().item() if global_tokens is None else global_tokens
    global_seqs = (mask.sum(-1) > 0).sum().item() if global_seqs is None else global_seqs
    global_tokens, global_seqs = max(global_tokens, 1.0), max(global_seqs, 1.0)
    horizon = loss_scale_factor if loss_scale_factor is not None else mask.shape[-1]
    return LOSS_AGGREGATIONS.get(mode)(loss_mat, mask, global_tokens, global_seqs, horizon) * dp_size
