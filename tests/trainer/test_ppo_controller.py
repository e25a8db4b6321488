"""Controller-side math of PPOTrainer without workers: token rewards, KL-in-reward, advantages."""

import math

import numpy as np
import pytest
import torch

from rlcore.config import compose
from rlcore.protocol import DataProto
from rlcore.trainer.ppo import PPOTrainer


def trainer(*overrides):
    cfg = compose(["recipe=tiny_cpu", *overrides])
    return PPOTrainer(cfg, groups={"actor_rollout": None}, reward_fn=None, val_reward_fn=None, train_loader=None, val_loader=None, tracker=None, total_steps=1)


def batch():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    return DataProto.from_dict(
        {"token_level_scores": scores, "response_mask": mask,
         "old_log_probs": torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, -2.0]]),
         "ref_log_prob": torch.tensor([[-1.5, -1.0, 0.0], [-2.0, -1.0, -2.0]])},
        {"uid": np.array(["a", "a"], dtype=object)},
    )


def test_kl_in_reward_subtracts_beta_times_kl_on_valid_tokens():
    t = trainer("algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl", "algorithm.kl_ctrl.kl_coef=0.1",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64")
    b = batch()
    metrics = t.compute_advantage(b)
    kl = torch.tensor([[0.5, 0.0, 0.0], [0.0, -1.0, 0.0]])  # k1 = old - ref, zero outside the mask
    torch.testing.assert_close(b.batch["token_level_rewards"], b.batch["token_level_scores"] - 0.1 * kl)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(((0.5 / 2) + (-1.0 / 3)) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1  # fixed controller


def test_grpo_without_kl_in_reward_uses_scores_as_rewards():
    t = trainer()
    b = batch()
    t.compute_advantage(b)
    assert torch.equal(b.batch["token_level_rewards"], b.batch["token_level_scores"])
    # group "a": scores 1 and 0 -> +-1/sqrt(2)/(std) = +-0.7071 broadcast on each response's valid tokens
    adv = b.batch["advantages"]
    assert adv[0, 0].item() == pytest.approx(0.70710, abs=1e-4) and adv[1, 2].item() == pytest.approx(-0.70710, abs=1e-4)
    assert adv[0, 2].item() == 0.0


def test_gae_uses_the_critic_values_in_the_batch():
    t = trainer("algorithm.adv_estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0")
    b = batch()
    b.batch["values"] = torch.tensor([[0.5, 0.25, 0.0], [0.1, 0.2, 0.3]])
    t.compute_advantage(b)
    # gamma = lam = 1: returns are the return-to-go (row 0: 1 on its 2nd token; row 1: 0), masked values added back
    torch.testing.assert_close(b.batch["returns"], torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    raw = b.batch["returns"] - b.batch["values"] * b.batch["response_mask"]
    from rlcore.algos.advantages import masked_whiten
    torch.testing.assert_close(b.batch["advantages"], masked_whiten(raw, b.batch["response_mask"]) * b.batch["response_mask"])


def test_data_metrics_report_the_critics_explained_variance():
    from rlcore.trainer.metrics import data_metrics

    b = batch()
    mask = b.batch["response_mask"]
    b.batch["values"] = torch.tensor([[0.9, 1.1, 0.0], [0.1, -0.1, 0.0]]) * mask
    b.batch["returns"] = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    b.batch.update({"token_level_rewards": b.batch["token_level_scores"], "advantages": b.batch["returns"],
                    "responses": torch.zeros(2, 3, dtype=torch.long), "prompts": torch.zeros(2, 2, dtype=torch.long),
                    "attention_mask": torch.ones(2, 5, dtype=torch.long)})
    metrics = data_metrics(b)
    # residuals [0.1, -0.1, -0.1, 0.1, 0] over 5 valid tokens: var 0.008; returns [1, 1, 0, 0, 0]: var 0.24
    assert metrics["critic/vf_explained_var"] == pytest.approx(1 - 0.008 / 0.24, abs=1e-6)
    assert metrics["critic/values/max"] == pytest.approx(1.1)


def test_balance_batch_gives_each_rank_the_same_tokens_and_keeps_rows_whole():
    from types import SimpleNamespace

    t = PPOTrainer(compose(["recipe=tiny_cpu"]), groups={"actor_rollout": SimpleNamespace(world_size=2, dp_size=lambda mesh=None: 2)}, reward_fn=None,
                   val_reward_fn=None, train_loader=None, val_loader=None, tracker=None, total_steps=1)
    lengths = [9, 8, 7, 6, 1, 1, 1, 1]  # as dispatched: rank 0 would get 30 tokens, rank 1 only 4
    mask = (torch.arange(9)[None] < torch.tensor(lengths)[:, None]).long()
    b = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(8)}, {"uid": np.array([f"u{i}" for i in range(8)], dtype=object)})
    metrics = {}
    out = t.balance_batch(b, metrics)
    chunks = out.chunk(2)
    assert [int(c.batch["attention_mask"].sum()) for c in chunks] == [17, 17]
    assert [f"u{r}" for r in out.batch["row"].tolist()] == list(out.non_tensor_batch["uid"])  # rows stay aligned
    assert metrics["global_seqlen/minmax_diff"] == 26.0 and metrics["global_seqlen/balanced_max"] == 17.0


RC = "algorithm.rollout_correction"


def test_rollout_correction_adds_weights_and_a_rejection_mask_for_the_actor_only():
    # ratios pi_train / pi_rollout: row 0 [3, 1 | pad], row 1 [1, 1/4, 1]
    t = trainer(f"{RC}.rollout_is=token", f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=2.0")
    assert not t.on_policy  # the tiny recipe's single update would skip the old-log-prob pass the weights come from
    b = batch()
    b.batch["advantages"] = torch.ones(2, 3)
    b.batch.update({k: torch.zeros(2, 3, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    b.batch["rollout_log_probs"] = b.batch["old_log_probs"] - torch.tensor([[math.log(3), 0.0, 0.0], [0.0, -math.log(4), 0.0]])
    metrics = t.correct_rollout(b)
    assert metrics["rollout_corr/kl"] == pytest.approx((math.log(4) - math.log(3)) / 5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.4)
    data = t.actor_batch(b)
    assert data.batch["rollout_is_weights"].tolist() == [[2.0, 1.0, 0.0], [1.0, 0.25, 1.0]]
    assert data.batch["response_mask"].tolist() == [[0, 1, 0], [1, 0, 1]]  # rejected tokens leave the update
    assert b.batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]  # ... not the step's data metrics
    assert "rollout_log_probs" not in data.batch.keys()  # measured here, not again in the actor


def test_measuring_only_and_on_policy_leaves_the_mismatch_to_the_actor():
    t = trainer()
    assert t.on_policy
    b = batch()
    b.batch["advantages"] = torch.ones(2, 3)
    b.batch.update({k: torch.zeros(2, 3, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    b.batch["rollout_log_probs"] = b.batch.pop("old_log_probs")  # on-policy: no old-log-prob pass ran
    assert t.correct_rollout(b) == {}
    assert "rollout_log_probs" in t.actor_batch(b).batch.keys()


def test_recorded_routes_reach_every_actor_pass():
    """Router replay: the routes the rollout (R3) or the old-log-prob pass (R2) recorded travel to the actor's old,
    reference and update passes (the run trained without replay while the controller's column lists dropped them)."""
    from rlcore.models.router import ROUTES
    from rlcore.trainer.ppo import FORWARD_KEYS, actor_keys

    t = trainer()
    b = batch()
    b.batch["advantages"] = torch.ones(2, 3)
    b.batch.update({k: torch.zeros(2, 3, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    assert actor_keys(b, FORWARD_KEYS) == FORWARD_KEYS and ROUTES not in t.actor_batch(b).batch.keys()
    b.batch[ROUTES] = torch.zeros(2, 3, 2, 2, dtype=torch.int16)
    assert ROUTES in actor_keys(b, FORWARD_KEYS) and ROUTES in t.actor_batch(b).batch.keys()
