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
    advantages = group_normalised_scores(token_level_rewards.sum(dim=-1), index, norm_adv_by_std_in_grpo, epsilon)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


def group_normalised_scores(scores: torch.Tensor, index: np.ndarray, norm_by_std: bool = True, epsilon: float = 1e-6) -> torch.Tensor:
    """GRPO's normalisation of one score per sample `[batch]` within its uid group: (s - mean_g) / (std_g + eps),
    unbiased std; a group of one gets mean 0 and std 1 (s itself), as in verl; without norm_by_std, s - mean_g."""
    advantages = torch.zeros_like(scores)
    for rows in group_indices(index).values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = group.mean(), group.std()
        centered = group - mean
        advantages[rows] = centered / (std + epsilon) if norm_by_std else centered
    return advantages


def compute_advantage(name: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    return ADV_ESTIMATORS.get(name)(**kwargs)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries of `[batch, len]` (unbiased variance)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count
    var = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps)


def _scores_and_groups(token_level_rewards: torch.Tensor, index: np.ndarray) -> tuple[torch.Tensor, list[list[int]]]:
    return token_level_rewards.sum(dim=-1), list(group_indices(index).values())


@ADV_ESTIMATORS.register("rloo")
def rloo_outcome_advantage(token_level_rewards, response_mask, index, **_):
    """RLOO: A_i = s_i - mean_{j != i} s_j = n/(n-1) (s_i - mean_g); a group of one sample keeps A_i = s_i."""
    scores, groups = _scores_and_groups(token_level_rewards, index)
    advantages = scores.clone()
    for rows in groups:
        n = len(rows)
        if n > 1:
            advantages[rows] = (scores[rows] - scores[rows].mean()) * n / (n - 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus_advantage(token_level_rewards, response_mask, config, **_):
    """REINFORCE++: G_t = r_t + gamma * G_{t+1} within the response (reset after it), whitened over valid tokens.

    Returns are the un-whitened G_t.
    """
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = (token_level_rewards[:, t] + config.gamma * running) * response_mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns, response_mask) * response_mask, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(token_level_rewards, response_mask, index, **_):
    """REINFORCE++ with baseline: (s_i - mean_g) broadcast over the response, then whitened over the batch."""
    scores, groups = _scores_and_groups(token_level_rewards, index)
    centered = scores.clone()
    for rows in groups:
        if len(rows) > 1:
            centered[rows] = scores[rows] - scores[rows].mean()
    advantages = masked_whiten(centered.unsqueeze(-1) * response_mask, response_mask) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("opo")
def opo_outcome_advantage(token_level_rewards, response_mask, index, **_):
    """OPO: baseline = length-weighted group mean sum_j |y_j| s_j / sum_j |y_j|; A_i = s_i - baseline."""
    scores, groups = _scores_and_groups(token_level_rewards, index)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    advantages = scores.clone()
    for rows in groups:
        if len(rows) > 1:
            advantages[rows] = scores[rows] - (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("grpo_passk")
def grpo_passk_advantage(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=True, epsilon=1e-6, **_):
    """Pass@k: only the best sample of a group is rewarded, with s_max - s_second (divided by the group std
    when norm_adv_by_std_in_grpo); every other sample gets 0. Needs >= 2 samples per group."""
    scores, groups = _scores_and_groups(token_level_rewards, index)
    advantages = torch.zeros_like(scores)
    for rows in groups:
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs actor_rollout_ref.rollout.n >= 2 samples per prompt; a group has {len(rows)}")
        top, order = torch.topk(scores[rows], 2)
        gap = top[0] - top[1]
        advantages[rows[int(order[0])]] = gap / (scores[rows].std() + epsilon) if norm_adv_by_std_in_grpo else gap
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("remax")
def remax_advantage(token_level_rewards, response_mask, reward_baselines, **_):
    """ReMax (Li et al. 2023): G_t = sum_{t' >= t} r_t' (undiscounted return-to-go), A_t = G_t - b with b the score
    of the prompt's greedy response (`reward_baselines` `[batch]`, generated by the controller). Returns G."""
    if reward_baselines is None:
        raise ValueError("algorithm.adv_estimator=remax needs reward_baselines (the controller's greedy generation)")
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    advantages = (returns - reward_baselines.unsqueeze(-1)) * response_mask
    return advantages, returns


@ADV_ESTIMATORS.register("gpg")
def gpg_outcome_advantage(token_level_rewards, response_mask, index, **_):
    """GPG: A_i = alpha (s_i - mean_g) with alpha = batch size / number of non-zero scores (no std division)."""
    scores, groups = _scores_and_groups(token_level_rewards, index)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    advantages = scores.clone()
    for rows in groups:
        if len(rows) > 1:
            advantages[rows] = scores[rows] - scores[rows].mean()
    advantages = (alpha * advantages).unsqueeze(-1) * response_mask
    return advantages, advantages


@ADV_ESTIMATORS.register("gae")
def gae_advantage(token_level_rewards, response_mask, values, config, **_) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al.): delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1} (V and A are 0
    after the response); returns = A + V; advantages whitened over valid tokens. All `[batch, response_len]`;
    `values` come from the critic (algorithm.adv_estimator=gae turns it on), gamma/lam from algorithm.*.
    """
    if values is None:
        raise ValueError("algorithm.adv_estimator=gae needs the critic's values; critic.enable must not be False")
    gamma, lam = config.gamma, config.lam
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        mask = response_mask[:, t].to(values.dtype)
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask
        next_value = values[:, t] * mask
        advantages[:, t] = next_adv
    returns = advantages + values * response_mask
    return masked_whiten(advantages, response_mask) * response_mask, returns



@ADV_ESTIMATORS.register("gdpo")
def gdpo_outcome_advantage(token_level_rewards, response_mask, index, reward_components=None, reward_weights=None,
                           norm_adv_by_std_in_grpo=True, epsilon=1e-6, **_):
    """GDPO (group reward-decoupled normalisation, arXiv 2601.05242): GRPO per reward dimension, then a weighted sum.

    `reward_components` `[batch, num_dims]`: each sample's score in each dimension (the values the reward function
    returned at algorithm.gdpo_reward_keys, in that order); `reward_weights` `[num_dims]` (algorithm.
    gdpo_reward_weights; None: all 1). Per dimension k, within each uid group g: A_k = (s_k - mean_g s_k) /
    (std_g s_k + eps) with GRPO's rules (group_normalised_scores); A = sum_k w_k A_k broadcast over the mask, then
    whitened over the batch's valid tokens. Summing the dimensions before normalising (GRPO) lets the one with the
    widest spread drown the others; normalising each first does not. `token_level_rewards` gives only the dtype.
    """
    if reward_components is None:
        raise ValueError("algorithm.adv_estimator=gdpo needs the reward's components: set algorithm.gdpo_reward_keys to the "
                         "keys of the dict your compute_score returns")
    components = torch.as_tensor(reward_components, dtype=token_level_rewards.dtype)
    weights = [1.0] * components.shape[1] if reward_weights is None else list(reward_weights)
    combined = sum(w * group_normalised_scores(components[:, k], index, norm_adv_by_std_in_grpo, epsilon) for k, w in enumerate(weights))
    advantages = masked_whiten(combined.unsqueeze(-1) * response_mask, response_mask) * response_mask
    return advantages, advantages
