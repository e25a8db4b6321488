import numpy as np
import pytest
import torch

from rlcore.algos import compute_advantage


def test_grpo_hand_computed_with_mask_and_singleton_group():
    # uid a: scores 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3); uid b: a single sample with score 0.5.
    rewards = torch.zeros(4, 3)
    rewards[0, 1] = 1.0
    rewards[3, 0] = 0.5
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0]]).float()
    adv, ret = compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask, index=np.array(["a", "a", "a", "b"], dtype=object))
    std = (1 / 3) ** 0.5
    expected = torch.tensor([(1 - 1 / 3) / (std + 1e-6), (0 - 1 / 3) / (std + 1e-6), (0 - 1 / 3) / (std + 1e-6), 0.5])
    assert torch.allclose(adv[:, 0], expected, atol=1e-6)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))  # zero outside the mask
    assert torch.equal(adv, ret)


def test_grpo_all_equal_rewards_give_zero_and_dr_grpo_skips_std():
    rewards = torch.tensor([[1.0], [1.0], [0.0], [2.0]])
    mask = torch.ones(4, 1)
    idx = np.array([0, 0, 1, 1], dtype=object)
    adv, _ = compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask, index=idx)
    assert adv[:2].abs().max() == 0
    adv, _ = compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask, index=idx, norm_adv_by_std_in_grpo=False)
    assert adv.squeeze(-1).tolist() == [0.0, 0.0, -1.0, 1.0]


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="valid: .*grpo"):
        compute_advantage("nope", token_level_rewards=torch.zeros(1, 1), response_mask=torch.ones(1, 1), index=np.array([0]))
