"""Reward-model training math: the Bradley-Terry pairwise loss and what is logged about it. Pure functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """Per pair: -log sigmoid(r_chosen - r_rejected - margin) (Llama 2's margin variant; margin 0 = plain BT).
    `logsigmoid` keeps it finite for large negative differences, where log(sigmoid(x)) underflows."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-pair accuracy (chosen scored higher) and reward margin (r_chosen - r_rejected)."""
    return {"accuracy": (chosen > rejected).float(), "margin": chosen - rejected}
