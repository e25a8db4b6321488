"""GDPO (algorithm.adv_estimator=gdpo, rlcore/algos/advantages.py) against verl 0.9's compute_gdpo_outcome_advantage
written out as verl computes it: each component placed on the response's last token, GRPO per component, the
weighted sum, then verl's masked_whiten; the config rules; and the trainer reading the components at
algorithm.gdpo_reward_keys with algorithm.gdpo_reward_weights."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlcore.algos import compute_advantage
from rlcore.config import compose
from rlcore.config.algorithm_schema import check_gdpo
from rlcore.config.validate import diagnose
from rlcore.protocol import DataProto
from rlcore.trainer.ppo import PPOTrainer


def _verl_grpo(token_rewards, mask, index, eps, norm):
    scores = token_rewards.sum(-1)
    by_uid = {}
    for i, uid in enumerate(index):
        by_uid.setdefault(uid, []).append(scores[i])
    stats = {uid: (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else (torch.stack(v).mean(), torch.stack(v).std())
             for uid, v in by_uid.items()}
    out = scores.clone()
    for i, uid in enumerate(index):
        mean, std = stats[uid]
        out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out.unsqueeze(-1) * mask


def _verl_masked_whiten(values, mask):
    count = mask.sum()
    mean = (values * mask).sum() / (count + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (count + 1e-8) * (count / (count - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_gdpo(components, weights, mask, index, eps=1e-6, norm=True):
    """components [batch, K]: verl reads each from non_tensor_batch[key] and writes it at the last valid position."""
    last = mask.sum(-1).long() - 1  # attention_mask over the response, summed, minus one (-1: an empty response)
    total = None
    for k in range(components.shape[1]):
        rewards = torch.zeros_like(mask)
        rewards[torch.arange(len(mask)), last] = components[:, k]
        term = (1.0 if weights is None else weights[k]) * _verl_grpo(rewards, mask, index, eps, norm)
        total = term if total is None else total + term
    return _verl_masked_whiten(total, mask) * mask


def _case(seed, num_dims):
    """Groups of 4, 4, 3, 2 and 1, ragged masks (one empty response), binary, real and tied components."""
    g = torch.Generator().manual_seed(seed)
    index = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 3 + ["d"] * 2 + ["e"], dtype=object)
    n, width = len(index), 6
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[5] = 0
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    columns = [torch.randint(0, 2, (n,), generator=g).double(), torch.randn(n, generator=g, dtype=torch.float64) * 3,
               torch.full((n,), 0.5, dtype=torch.float64)]
    return torch.stack(columns[:num_dims], 1), mask, index


@pytest.mark.parametrize("seed,num_dims,weights,norm", [(0, 2, None, True), (1, 3, [1.0, 0.3, 2.0], True),
                                                        (2, 1, None, True), (3, 2, [2.0, -0.5], False)])
def test_gdpo_equals_verls_formula(seed, num_dims, weights, norm):
    components, mask, index = _case(seed, num_dims)
    got, returns = compute_advantage("gdpo", token_level_rewards=torch.zeros_like(mask), response_mask=mask, index=index,
                                     reward_components=components, reward_weights=weights, norm_adv_by_std_in_grpo=norm)
    want = _verl_gdpo(components, weights, mask, index, norm=norm)
    # verl's masked mean divides by count + 1e-8: a relative 1e-8 of the valid-token count (~50) apart
    assert (got - want).abs().max().item() < 1e-8
    assert torch.equal(got, returns) and (got[mask == 0] == 0).all()


def test_each_dimension_is_normalised_before_the_sum():
    """A wide-spread dimension (length x 100) does not drown a 0/1 one: a right answer outranks a wrong one of
    similar length inside each group, which GRPO on the summed score does not guarantee."""
    index = np.array(["p"] * 4, dtype=object)
    mask = torch.ones(4, 3, dtype=torch.float64)
    components = torch.tensor([[1.0, 100.0], [0.0, 300.0], [1.0, 200.0], [0.0, 210.0]], dtype=torch.float64)
    gdpo = compute_advantage("gdpo", token_level_rewards=torch.zeros_like(mask), response_mask=mask, index=index,
                             reward_components=components)[0][:, 0]
    grpo = compute_advantage("grpo", token_level_rewards=components.sum(1, keepdim=True) * torch.tensor([[0.0, 0.0, 1.0]]),
                             response_mask=mask, index=index)[0][:, 0]
    assert gdpo[2] > gdpo[3] and grpo[2] < grpo[3]


KEYS = "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]"


def test_gdpo_needs_its_keys_one_weight_each_and_no_in_reward_kl():
    def errors(*overrides):
        return diagnose(compose(["recipe=tiny_cpu", *overrides]))[1]

    problems = errors("algorithm.adv_estimator=gdpo", "algorithm.use_kl_in_reward=True")
    assert len(problems) == 2
    assert problems[0].startswith("algorithm.adv_estimator=gdpo normalises each reward dimension apart and needs their names")
    assert problems[1].startswith("algorithm.use_kl_in_reward=True with algorithm.adv_estimator=gdpo")
    assert errors("algorithm.adv_estimator=gdpo", KEYS, "+algorithm.gdpo_reward_weights=[1.0]") == [
        "algorithm.gdpo_reward_weights has 1 weight(s) for the 2 key(s) of algorithm.gdpo_reward_keys=['accuracy_reward', "
        "'format_reward']; give one weight per key, or drop algorithm.gdpo_reward_weights (all 1)"]
    # the keys without GDPO would be ignored: refused (the rule alone, on a config of the fields it reads)
    checker = SimpleNamespace(cfg=OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "gdpo_reward_keys": ["acc"],
                                                                  "gdpo_reward_weights": None}}), errors=[])
    checker.error = checker.errors.append
    check_gdpo(checker)
    assert checker.errors == ["algorithm.gdpo_reward_keys=['acc'] is read only by algorithm.adv_estimator=gdpo (here grpo); set "
                              "algorithm.adv_estimator=gdpo, or drop algorithm.gdpo_reward_keys"]


def test_the_trainer_reads_the_components_at_gdpo_reward_keys_with_gdpo_reward_weights():
    """PPOTrainer.compute_advantage stacks the batch's columns named by algorithm.gdpo_reward_keys (in that order; the
    reward manager's extras, put there after scoring) and weighs them by algorithm.gdpo_reward_weights."""
    cfg = compose(["recipe=tiny_cpu", "algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]",
                   "+algorithm.gdpo_reward_weights=[0.5,2.0]"])
    trainer = PPOTrainer(cfg, groups={"actor_rollout": None}, reward_fn=None, val_reward_fn=None, train_loader=None,
                         val_loader=None, tracker=None, total_steps=1)
    components, mask, index = _case(4, 2)
    batch = DataProto.from_dict({"token_level_scores": torch.zeros_like(mask), "response_mask": mask},
                                {"uid": index, "accuracy_reward": components[:, 0].numpy(), "format_reward": components[:, 1].numpy()})
    trainer.compute_advantage(batch)
    want = _verl_gdpo(components[:, [1, 0]], [0.5, 2.0], mask, index)
    assert (batch.batch["advantages"] - want).abs().max().item() < 1e-6  # float32 token_level_scores
