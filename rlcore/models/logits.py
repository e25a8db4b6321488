"""Log-probs and entropy of response tokens from logits."""

from __future__ import annotations

import torch


def response_logits(logits: torch.Tensor, response_len: int, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict the response tokens: positions [-R-1, -1) of `[batch, seq, vocab]` (next-token shift).

    Divided by the sampling temperature so log-probs match the distribution the rollout sampled from.
    """
    return scale_logits(logits[:, -response_len - 1 : -1, :], temperature)


def scale_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """float32 logits divided by the sampling temperature (0 = greedy and 1 leave them unchanged)."""
    out = logits.float()
    return out / temperature if temperature not in (0.0, 1.0) else out


def gather_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token]: `[batch, len, vocab]`, `[batch, len]` -> `[batch, len]`."""
    return torch.gather(logits.log_softmax(dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z, per position: `[batch, len, vocab]` -> `[batch, len]`."""
    probs = logits.softmax(dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
