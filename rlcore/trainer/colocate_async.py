"""verl 0.9's `trainer.v1.trainer_mode=colocate_async` on the hybrid engine: the trainer's side.

Each step sends the hybrid workers one more prompt batch (the first step `1 + num_warmup_batches`), and each rank
returns its share of the step's groups, the first to finish, keeping the rest part-way for the next step
(rlcore.rollout.partial). The trainer keeps every row's columns but the prompt's (uid, the reward's ground truth, a
ReMax baseline) from the moment it is sent until it is trained, and joins them to the sequences by `row_id`. A step
logs how stale its samples are (`async/staleness_*`: trainer steps since the weights a sample started under), the
share resumed under newer weights (`async/partial_ratio`), the samples dropped by verl's bound and the rows carried.
"""

from __future__ import annotations

import numpy as np
import torch

from rlcore.protocol import DataProto
from rlcore.rollout.partial import groups_to_drop

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


class ColocatedAsync:
    """The trainer's record of the rows in flight on the hybrid workers, and the step's samples taken from them."""

    def __init__(self, cfg, workers) -> None:
        """`workers`: the hybrid worker group."""
        self.workers = workers
        self.warmup = cfg.trainer.v1.colocate_async.num_warmup_batches
        self.groups = cfg.data.train_batch_size
        sampler = cfg.trainer.v1.sampler
        self.max_span = sampler.max_off_policy_threshold if sampler.max_off_policy_strategy == "drop" else None
        self.n = cfg.actor_rollout_ref.rollout.n
        self.waiting: DataProto | None = None  # rows sent and not trained: every column but the prompt's, and row_id
        self.started: torch.Tensor | None = None  # the weights version each waiting row was sent under
        self.next_id = 0
        self.dropped = 0  # the last step's samples dropped by the bound

    def batches_due(self) -> int:
        """Prompt batches the next step adds: one, and the warm-up's on the first step."""
        return 1 if self.waiting is not None else 1 + self.warmup

    def take(self, new: list[DataProto], metrics: dict[str, float], step: int) -> DataProto:
        """Step `step`'s samples, unscored: data.train_batch_size groups. `new`: the batches_due() prompt batches
        it adds, rollout.n rows per prompt with their uid (as the synchronous step makes them)."""
        batch = DataProto.concat(new) if len(new) > 1 else new[0]
        batch.batch["row_id"] = torch.arange(self.next_id, self.next_id + len(batch))
        self.next_id += len(batch)
        prompts = batch.pop(PROMPT_KEYS + ["row_id"])
        batch.batch["row_id"] = prompts.batch["row_id"]
        self._add(batch, step - 1)
        prompts.meta_info["colocate_async"] = {"version": step - 1, "groups": self.groups // self.workers.world_size}
        out = self.workers.generate_sequences(prompts)
        metrics.update(out.meta_info["timing"])
        metrics.update(out.meta_info["memory"])
        out.meta_info.clear()
        taken = self._remove(out.pop(["row_id"]).batch["row_id"])
        versions = out.pop(["rollout_versions"]).batch["rollout_versions"]
        staleness = (step - 1 - versions[:, 0]).float()
        metrics.update({"async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max()),
                        "async/partial_ratio": float((versions[:, 1] > versions[:, 0]).float().mean()),
                        "async/carried_rows": len(self.waiting), "async/dropped_samples": self.dropped,
                        "async/param_version": step - 1})
        return taken.union(out)

    def _add(self, batch: DataProto, version: int) -> None:
        """Keeps the sent rows' columns until they are trained; with the drop strategy, forgets the rows the workers
        drop now (the same rule on the same versions: verl's bound)."""
        started = torch.full((len(batch),), version)
        if self.waiting is None:
            self.waiting, self.started = batch, started
        else:
            self.waiting, self.started = DataProto.concat([self.waiting, batch]), torch.cat([self.started, started])
        self.dropped = 0
        if self.max_span is not None:
            stale = groups_to_drop(self.started, version + 1, self.n, self.max_span)
            self.dropped = int(stale.sum())
            if self.dropped:
                keep = np.flatnonzero(~stale.numpy())
                self.waiting, self.started = self.waiting.index(keep), self.started[keep]

    def _remove(self, row_ids: torch.Tensor) -> DataProto:
        """The waiting rows `row_ids` (in that order), no longer waiting."""
        position = {int(r): i for i, r in enumerate(self.waiting.batch["row_id"].tolist())}
        rows = np.array([position[int(r)] for r in row_ids.tolist()])
        taken = self.waiting.index(rows)
        keep = np.setdiff1d(np.arange(len(self.waiting)), rows)
        self.waiting, self.started = self.waiting.index(keep), self.started[keep]
        taken.pop(["row_id"])
        return taken
