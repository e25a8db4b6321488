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


def test_rollout_is_threshold_truncates_and_rollout_is_batch_normalize_rescales_the_weights():
    # ratios pi_train / pi_rollout: row 0 [3, 1 | pad], row 1 [1, 1/4, 1]
    def weights(*overrides):
        b = batch()
        b.batch["rollout_log_probs"] = b.batch["old_log_probs"] - torch.tensor([[math.log(3), 0.0, 0.0], [0.0, -math.log(4), 0.0]])
        metrics = trainer(f"{RC}.rollout_is=token", *overrides).correct_rollout(b)
        return b.batch["rollout_is_weights"], metrics

    w, _ = weights(f"{RC}.rollout_is_threshold=2.0")
    assert w.tolist() == [[2.0, 1.0, 0.0], [1.0, 0.25, 1.0]]  # 3 truncated at the threshold
    w, m = weights(f"{RC}.rollout_is_threshold=4.0")
    assert w.tolist() == [[3.0, 1.0, 0.0], [1.0, 0.25, 1.0]] and m["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    w, m = weights(f"{RC}.rollout_is_threshold=2.0", f"{RC}.rollout_is_batch_normalize=True")
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(5.25 / 5)  # the truncated weights' token mean
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.25, 1.0]]) / 1.05)
    assert (w * batch().batch["response_mask"]).sum().item() == pytest.approx(5.0)  # they now average 1


def scored(group_scores: list[list[float]], tag: int) -> DataProto:
    """One prompt's group per inner list (contiguous samples); the score on the last of 3 response tokens."""
    rows = [(g, s) for g, scores in enumerate(group_scores) for s in scores]
    scores = torch.zeros(len(rows), 3)
    scores[:, -1] = torch.tensor([s for _, s in rows])
    return DataProto.from_dict({"token_level_scores": scores}, {"uid": np.array([f"{tag}-{g}" for g, _ in rows], dtype=object)})


def test_filter_groups_enable_fills_the_step_with_groups_whose_scores_differ():
    generation = [[[1, 1], [0, 1]], [[0, 0], [1, 0]], [[0, 1], [1, 1]]]  # per generation batch: 2 prompts x rollout.n=2

    def collect(*overrides):
        t = trainer("data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "algorithm.filter_groups.metric=seq_reward", *overrides)
        made = iter(scored(groups, tag) for tag, groups in enumerate(generation))
        t.next_batch = lambda: None
        t.generate_and_score = lambda prompts, metrics: (next(made), {})
        metrics = {}
        return t.collect_samples(metrics), metrics

    plain, metrics = collect("algorithm.filter_groups.enable=False")
    assert plain.non_tensor_batch["uid"].tolist() == ["0-0", "0-0", "0-1", "0-1"] and metrics == {}  # the first batch as it came
    kept, metrics = collect("algorithm.filter_groups.enable=True")
    assert kept.non_tensor_batch["uid"].tolist() == ["0-1", "0-1", "1-1", "1-1"]  # [1, 1] and [0, 0] carry no signal
    assert metrics == {"train/num_gen_batches": 2, "train/kept_group_ratio": 0.5}


class Log:
    jsonl_path = "/nonexistent/run/metrics.jsonl"

    def __init__(self):
        self.rows = []

    def log(self, metrics, step):
        self.rows.append((step, metrics))


def test_val_only_validates_once_and_trains_nothing(monkeypatch):
    import rlcore.trainer.ppo as ppo

    monkeypatch.setattr(ppo, "start_step_perf", lambda *args: None)

    def fit(*overrides):
        t = trainer("trainer.val_before_train=False", *overrides)
        t.tracker, t.val_loader = Log(), object()
        t.maybe_resume = lambda: None
        t.validate = lambda: {"val/score": 0.5}

        def train_step():
            raise RuntimeError("trained")

        t.train_step = train_step
        return t.fit(), t.tracker.rows

    assert fit("trainer.val_only=True") == ({}, [(0, {"val/score": 0.5})])
    with pytest.raises(RuntimeError, match="trained"):  # without it the same run goes on to train
        fit("trainer.val_only=False")


@pytest.mark.parametrize("test_freq, validated_at", [(2, [2, 4, 5]), (-1, [])])
def test_test_freq_validates_every_n_steps_and_after_the_last(test_freq, validated_at):
    t = trainer(f"trainer.test_freq={test_freq}")
    due = []
    for step in range(1, 6):
        t.global_step = step
        due += [step] if t._due(t.cfg.trainer.test_freq, step == 5) else []
    assert due == validated_at


def test_use_rollout_log_probs_makes_stale_split_pool_steps_bypass_the_old_log_prob_pass():
    split = ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=0.5", "data.gen_batch_size=32"]

    def split_trainer(*overrides):
        cfg = compose(["recipe=tiny_cpu", *split, *overrides])
        return PPOTrainer(cfg, groups={"actor_rollout": None, "rollout": object()}, reward_fn=None, val_reward_fn=None, train_loader=None,
                          val_loader=None, tracker=None, total_steps=1)

    def step_batch():
        b = batch()
        b.batch["rollout_log_probs"] = b.batch["old_log_probs"] - 0.5
        b.batch["advantages"] = torch.ones(2, 3)
        b.batch.update({k: torch.zeros(2, 3, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids", "responses")})
        return b

    bypass = split_trainer("async_training.use_rollout_log_probs=True")
    assert bypass.bypass and not bypass.on_policy
    b = step_batch()
    assert bypass.correct_rollout(b) == {}  # the rollout's log-probs are the old policy: no trainer-side mismatch
    assert "rollout_log_probs" in bypass.actor_batch(b).batch.keys()  # the actor takes its ratio against them
    own = split_trainer("async_training.use_rollout_log_probs=False")
    assert not own.bypass and not own.on_policy  # the old log-probs come from the trainer's pass
    assert own.correct_rollout(step_batch())["rollout_corr/log_ratio_mean"] == pytest.approx(0.5)
    assert split_trainer("async_training.use_rollout_log_probs=True", "async_training.compute_prox_log_prob=True").bypass is False


def test_a_run_ends_with_its_held_out_scores_and_where_its_checkpoint_and_hf_model_went():
    """A newcomer's run never said where the checkpoint went: its last lines (printed after the report) do now, with
    the command that resumes from it."""
    from types import SimpleNamespace

    t = trainer("trainer.resume_mode=auto")
    t.tracker = SimpleNamespace(closing=[])
    t.val_history, t.last_checkpoint = [(0, 0.276), (800, 0.702)], "/ckpt/run/global_step_800"
    t.report_end()
    assert t.tracker.closing == [
        "val accuracy before RL: 0.2760", "val accuracy after RL: 0.7020",
        "checkpoint: /ckpt/run/global_step_800 (the HF model: /ckpt/run/global_step_800/actor/huggingface); "
        "to resume, rerun the command with trainer.default_local_dir=/ckpt/run"]
    t.tracker.closing, t.val_history, t.last_checkpoint = [], [(3, 0.5)], None  # no validation before RL, no save
    t.report_end()
    assert t.tracker.closing == []
