"""PF-PPO (policy filtration for PPO, Shen et al. 2024, arXiv 2409.06957): after GAE, the step's samples are drawn
again, with replacement, in proportion to a weight of their score, so that the update learns mostly from the
samples whose reward is most reliable (the extremes). verl's `algorithm.use_pf_ppo` / `pf_ppo.*`.

Weights from each sample's summed token-level score s (verl's methods):
- pow:        |s| ** weight_pow
- max_min:    1 for the batch's highest and lowest score, 0 otherwise
- max_random: 0.4 for the highest score, 0.1 otherwise
then w + 1e-8 (no sample has probability 0), and as many draws as there are samples.
"""

from __future__ import annotations

import torch

from rlcore.config.algorithm_schema import REWEIGHT_METHODS


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """`scores` [batch] -> sampling weights [batch] (unnormalised, all > 0)."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r}; valid: {', '.join(REWEIGHT_METHODS)}")
    return (weights + 1e-8).clamp(min=1e-8)


def pf_ppo_rows(scores: torch.Tensor, method: str, weight_pow: float, generator: torch.Generator) -> torch.Tensor:
    """The rows of the resampled batch: len(scores) draws with replacement, by pf_ppo_weights. `generator` makes
    the draw a function of the run's seed and step, so a resumed run draws what the straight one did."""
    weights = pf_ppo_weights(scores.detach().float().cpu(), method, weight_pow)
    return torch.multinomial(weights, len(scores), replacement=True, generator=generator)
