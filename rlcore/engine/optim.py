"""Learning-rate schedules shared by all engines."""

from __future__ import annotations

import math

import torch


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, kind: str, min_lr_ratio: float, num_cycles: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps`, then constant or cosine decay to `min_lr_ratio` at `total_steps`."""
    if kind not in ("constant", "cosine"):
        raise ValueError(f"unknown optim.lr_scheduler_type={kind!r}; valid: constant, cosine")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * min(progress, 1.0)))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
