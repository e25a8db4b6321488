"""Advantage estimators, registered by `algorithm.adv_estimator`.

Each takes `token_level_rewards` `[batch, response_len]`, `response_mask` `[batch, response_len]` and keyword
context (`index`: the uid of each sample's prompt, `config`: the algorithm config) and returns
`(advantages, returns)`, both `[batch, response_len]`, zero outside the mask.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from rlcore.algos.registry import Registry

ADV_ESTIMATORS = Registry("advantage estimator", "algorithm.adv_estimator")


def group_indices(index: np.ndarray) -> dict[object, list[int]]:
    groups: dict[object, list[int]] = defaultdict(list)
    for i, uid in enumerate(index):
        groups[uid].append(i)
    return groups


@ADV_ESTIMATORS.register("grpo")
def grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: score s_i = sum_t r_{i,t}; A_i = (s_i - mean_g) / (std_g + eps) over the samples g sharing a uid.

    std is the unbiased sample std (torch.std). A group of one sample gets mean 0 and std 1 (A_i = s_i), as in
    verl. With `norm_adv_by_std_in_grpo=False` (Dr. GRPO) A_i = s_i - mean_g. A_i is broadcast over the mask.
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    for rows in group_indices(index).values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = group.mean(), group.std()
        centered = group - mean
        advantages[rows] = centered / (std + epsilon) if norm_adv_by_std_in_grpo else centered
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_advantage(name: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    return ADV_ESTIMATORS.get(name)(**kwargs)
