"""Generation dumps (trainer.rollout_data_dir, trainer.validation_data_dir) and PPOTrainer.validate()'s metrics with
val_kwargs.n=4, through the real reward manager and a scripted rollout."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from rlcore.config import compose
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.protocol import DataProto
from rlcore.reward.manager import RewardManager
from rlcore.trainer.generation_dump import dump_generations
from rlcore.trainer.ppo import PPOTrainer, to_proto
from rlcore.trainer.val_metrics import process_validation_metrics, sectioned_metrics

TOK = build_char_tokenizer()
# Each question's responses, handed out in turn: 2+3 right twice (" 5" strips to "5"), 1+1 once, 4+4 three times.
ANSWERS = {"2+3=": ["5", " 5", "6", "x"], "1+1=": ["2", "3", "3", "4"], "4+4=": ["8", "8", "9", "8"]}
TRUTHS = {"2+3=": "5", "1+1=": "2", "4+4=": "8"}


class ScriptedRollout:
    """An actor_rollout group whose generate_sequences answers each question with its next scripted response."""

    world_size = 1

    def __init__(self) -> None:
        self.calls: Counter = Counter()

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        responses = []
        for question in TOK.batch_decode(prompts.batch["input_ids"], skip_special_tokens=True):
            responses.append(ANSWERS[question][self.calls[question] % 4])
            self.calls[question] += 1
        ids = [TOK.convert_tokens_to_ids(list(r)) + [TOK.eos_token_id] for r in responses]
        width = max(map(len, ids))
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        tensors = {"prompts": prompts.batch["input_ids"], "responses": torch.tensor([x + [TOK.pad_token_id] * (width - len(x)) for x in ids]),
                   "response_mask": mask, "attention_mask": torch.cat([prompts.batch["attention_mask"], mask], -1)}
        return DataProto.from_dict(tensors, meta_info={"timing": {}, "memory": {}})


class ListTracker:
    def __init__(self) -> None:
        self.generations = []

    def log_generations(self, samples, step):
        self.generations.append((step, samples))


def raw_batch(questions):
    """A batch as the data loader yields it: left-padded chat prompts plus object columns."""
    enc = TOK([f"<|user|>{q}<|assistant|>" for q in questions], padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "position_ids": (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0),
            "data_source": np.array(["tiny_add"] * len(questions), dtype=object),
            "reward_model": np.array([{"ground_truth": TRUTHS[q]} for q in questions], dtype=object)}


def make_trainer(tmp_path, *overrides):
    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.val_kwargs.n=4",
                   f"trainer.validation_data_dir={tmp_path}/val", f"trainer.rollout_data_dir={tmp_path}/rollout", *overrides])
    manager = RewardManager(TOK)
    val_loader = [raw_batch(["2+3=", "1+1="]), raw_batch(["4+4="])]  # prompt numbering continues across batches
    return PPOTrainer(cfg, groups={"actor_rollout": ScriptedRollout()}, reward_fn=manager, val_reward_fn=manager, train_loader=None,
                      val_loader=val_loader, tracker=ListTracker(), total_steps=1)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_validate_with_four_samples_logs_verls_metrics_and_dumps_every_generation(tmp_path):
    trainer = make_trainer(tmp_path, "trainer.log_val_generations=3")
    metrics = trainer.validate()
    rewards = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    preds = ["5", "5", "6", "x", "2", "3", "3", "4", "8", "8", "9", "8"]
    expected = sectioned_metrics(process_validation_metrics(["tiny_add"] * 12, np.repeat([0, 1, 2], 4), {"reward": rewards, "pred": preds}))
    assert metrics == expected and len(metrics) == 17
    assert metrics["val-core/tiny_add/reward/mean@4"] == pytest.approx(0.5)  # (2 + 1 + 3) / 12
    assert metrics["val-aux/tiny_add/reward/pass@2"] == pytest.approx((5 / 6 + 1 / 2 + 1) / 3)
    assert trainer.val_history == [(0, pytest.approx(0.5))]
    assert [len(samples) for _, samples in trainer.tracker.generations] == [3]  # log_val_generations still works
    records = read_jsonl(tmp_path / "val" / "0.jsonl")
    assert len(records) == 12
    assert records[1] == {"input": "<|user|>2+3=<|assistant|>", "output": " 5", "gts": "5", "score": 1.0, "step": 0, "pred": "5"}
    assert [r["score"] for r in records] == rewards and [r["pred"] for r in records] == preds
    trainer.validate()  # the same step validated again replaces its file
    assert len(read_jsonl(tmp_path / "val" / "0.jsonl")) == 12


def test_each_training_generation_batch_is_appended_to_its_steps_file(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.global_step = 2
    for _ in range(2):  # dynamic sampling: a step may generate several batches
        batch, extras = trainer.generate_and_score(to_proto(raw_batch(["2+3=", "1+1="])), metrics={})
    records = read_jsonl(tmp_path / "rollout" / "2.jsonl")
    assert len(records) == 16 and {r["step"] for r in records} == {2}
    assert [r["score"] for r in records[8:]] == batch.batch["token_level_scores"].sum(-1).tolist()
    assert [r["output"] for r in records[:4]] == ANSWERS["2+3="] and [r["gts"] for r in records[4:8]] == ["2"] * 4
    assert [r["pred"] for r in records[8:]] == extras["pred"]
    assert not (tmp_path / "val").exists()


def test_dump_writes_json_for_numpy_ground_truths_and_text_extras(tmp_path):
    batch = ScriptedRollout().generate_sequences(to_proto(raw_batch(["1+1="])))
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": np.array([2, 3])}], dtype=object)
    scores = torch.tensor([[0.0, 0.5]])
    path = dump_generations(str(tmp_path / "new"), 7, RewardManager(TOK), batch, scores, {"acc": [0.0], "pred": [None]}, fresh=True)
    assert read_jsonl(path) == [{"input": "<|user|>1+1=<|assistant|>", "output": "2", "gts": [2, 3], "score": 0.5, "step": 7,
                                 "acc": 0.0, "pred": None}]
