"""Reward-model training's controller loop: shuffled pair batches to the worker group, validation, HF export."""

from __future__ import annotations

import json
import os

import numpy as np

from rlcore.data.pairs import PairData
from rlcore.trainer import checkpoint


class RewardModelTrainer:
    def __init__(self, cfg, group, train: PairData, val: PairData | None, pad_token_id: int, tracker, total_steps: int) -> None:
        self.cfg, self.group, self.train, self.val, self.pad, self.tracker = cfg, group, train, val, pad_token_id, tracker
        self.total_steps = total_steps
        self.world = group.world_size
        self.rng = np.random.default_rng(cfg.data.seed if cfg.data.seed is not None else cfg.trainer.seed)

    def batches(self):
        """Pair indices of each step: a fresh permutation per epoch, the last partial batch dropped."""
        size = self.cfg.data.train_batch_size
        while True:
            order = self.rng.permutation(len(self.train)) if self.cfg.data.shuffle else np.arange(len(self.train))
            for start in range(0, len(order) - size + 1, size):
                yield order[start : start + size].tolist()

    def fit(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        batches = self.batches()
        for step in range(1, self.total_steps + 1):
            metrics = self.group.train_batch(self.train.batch(next(batches), self.pad, self.cfg.data.max_length))
            last = step == self.total_steps
            if self.val is not None and (last or self.cfg.trainer.test_freq > 0 and step % self.cfg.trainer.test_freq == 0):
                metrics.update(self.validate())
            if last or self.cfg.trainer.save_freq > 0 and step % self.cfg.trainer.save_freq == 0:
                metrics["checkpoint"] = self.save(step)
            self.tracker.log({k: v for k, v in metrics.items() if k != "checkpoint"}, step=step)
            self.tracker.advance()
        return metrics

    def validate(self) -> dict[str, float]:
        """Loss, accuracy (chosen scored higher) and margin over the held-out pairs, in whole pairs per rank."""
        limit = self.cfg.data.val_max_pairs or len(self.val)
        usable = min(limit, len(self.val)) // self.world * self.world  # every rank gets the same number of whole pairs
        metrics, size = {}, self.cfg.data.train_batch_size
        totals: dict[str, float] = {}
        for start in range(0, usable, size):
            index = list(range(start, min(start + size, usable)))
            for key, value in self.group.evaluate(self.val.batch(index, self.pad, self.cfg.data.max_length)).items():
                totals[key] = totals.get(key, 0.0) + value * len(index)
        metrics.update({k: v / usable for k, v in totals.items()})
        metrics["val/pairs"] = usable
        return metrics

    def save(self, step: int) -> str:
        """global_step_N/rm/ (sharded state) + rm/huggingface/ (an HF *ForSequenceClassification with one label)."""
        root = os.path.abspath(self.cfg.trainer.default_local_dir)
        tmp = checkpoint.begin(root, step, role="rm")
        hf_dir = os.path.join(tmp, "rm", "huggingface")
        self.group.save_checkpoint(os.path.join(tmp, "rm"), hf_dir)
        with open(os.path.join(hf_dir, "rlcore_rm.json"), "w") as f:
            json.dump({"step": step, "base_model": self.cfg.model.path}, f)
        return os.path.join(checkpoint.publish(root, step, tmp, None), "rm", "huggingface")
