"""The supervised controller loop (rlcore-rm, rlcore-sft) against a scripted worker group: trainer.stop_metric ends the
run at the first validation that passes, and resume replays the batch order and skips a finished run."""

import json
import os

import pytest

from rlcore.config import ConfigError
from rlcore.train_sft import compose_sft, sft_config_errors
from rlcore.trainer.supervised import SupervisedTrainer, resume_point
from rlcore.telemetry.tracking import Tracker


class ScriptedGroup:
    """val/exact_match rises by 0.1 per step trained; records the batches it trains on and what it loads."""

    world_size = 2

    def __init__(self):
        self.steps, self.batches, self.loaded = 0, [], []

    def train_batch(self, data):
        self.steps += 1
        self.batches.append(data)
        return {"train/loss": 1.0 / self.steps}

    def evaluate(self, data):
        return {"val/exact_match": 0.1 * self.steps}

    def save_checkpoint(self, path, hf_dir):
        os.makedirs(hf_dir, exist_ok=True)

    def load_checkpoint(self, path):
        self.loaded.append(path)


class Rows:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def batch(self, index, pad, max_length):
        return tuple(index)


def run(tmp_path, total, *overrides):
    cfg = compose_sft([f"trainer.default_local_dir={tmp_path}/ckpt", "data.train_batch_size=4", "trainer.test_freq=2", *overrides])
    resume_from, start = resume_point(cfg.trainer)
    tracker = Tracker([], str(tmp_path / "run"), total, start_step=start)
    group = ScriptedGroup()
    group.steps = start
    try:
        final = SupervisedTrainer(cfg, group, Rows(10), Rows(4), 0, tracker, total, "sft", resume_from).fit()
    finally:
        tracker.close()
    return final, group


def test_stop_when_ends_at_the_first_passing_validation_and_resume_skips_the_finished_run(tmp_path):
    rule = ["trainer.stop_metric=val/exact_match", "trainer.stop_threshold=0.35"]
    final, group = run(tmp_path, 10, *rule)
    assert final["step"] == 4 and final["val/exact_match"] == pytest.approx(0.4) and group.steps == 4  # not at step 2 (0.2)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["global_step_4", "latest_checkpointed_iteration.txt"]
    state = json.load(open(tmp_path / "ckpt" / "global_step_4" / "trainer_state.json"))
    assert state["stopped_by"] == "val/exact_match >= 0.35" and state["metrics"]["train/loss"] == 0.25
    again, group = run(tmp_path, 10, *rule)
    assert group.batches == [] and group.loaded == [] and again["step"] == 4 and again["val/exact_match"] == pytest.approx(0.4)
    assert again["checkpoint"] == str(tmp_path / "ckpt" / "global_step_4" / "sft" / "huggingface")


def test_resume_continues_with_the_batches_the_uninterrupted_run_would_train(tmp_path):
    straight = run(tmp_path / "a", 6, "trainer.save_freq=3")[1].batches
    run(tmp_path / "b", 3)  # 2 batches per epoch of 10 rows: the resumed run starts mid-way through epoch 2
    final, group = run(tmp_path / "b", 6)
    assert group.loaded == [str(tmp_path / "b" / "ckpt" / "global_step_3" / "sft")]
    assert group.batches == straight[3:] and final["step"] == 6 and len(set(straight)) == 6
    fresh = run(tmp_path / "b", 6, "trainer.resume_mode=disable")[1]
    assert fresh.batches == straight and fresh.loaded == []


def test_stop_rule_and_resume_keys_are_checked():
    cfg = compose_sft(["trainer.stop_metric=train/loss", "trainer.stop_mode=lowest", "trainer.resume_mode=resume_path"])
    assert sft_config_errors(cfg) == [
        "trainer.resume_mode=resume_path needs trainer.resume_from_path (a folder such as <trainer.default_local_dir>/global_step_100); "
        "set it or use trainer.resume_mode=auto",
        "trainer.stop_mode=lowest is not max (stop once the metric is >= trainer.stop_threshold) or min (<=)",
        "trainer.stop_metric=train/loss is checked at validation: it needs a val/ metric, data.val_files and trainer.test_freq > 0 "
        "(how often to validate)"]
    with pytest.raises(ConfigError, match="/nonexistent does not exist"):
        resume_point(compose_sft(["trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent"]).trainer)
