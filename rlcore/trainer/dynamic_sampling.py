"""DAPO's dynamic sampling (verl's `algorithm.filter_groups`): keep only the groups whose samples score differently.

A group whose `rollout.n` samples all get the same reward has zero advantage under GRPO-style estimators: it costs
a full update and teaches nothing. The controller drops such groups (the decision: rlcore.algos.group_filter) and draws further generation batches
(`data.gen_batch_size` prompts each) until `data.train_batch_size` prompts remain, failing after
`max_num_gen_batches` batches (<= 0: never).
"""

from __future__ import annotations

import numpy as np
import torch

from rlcore.protocol import DataProto

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward", "score")  # from token_level_scores; others: scorer extras


def sample_metric(batch: DataProto, metric: str, extras: dict[str, list[float]]) -> np.ndarray:
    """One value per sample: the summed score (`seq_reward`; `seq_final_reward` and `score` are the same before any
    in-reward KL penalty, which rlcore applies after filtering) or a value the scorer returned (e.g. `acc`)."""
    if metric in SEQUENCE_METRICS:
        return batch.batch["token_level_scores"].sum(-1).to(torch.float64).numpy()
    if metric not in extras:
        raise ValueError(f"algorithm.filter_groups.metric={metric} is not a value the reward function returned (it returned "
                         f"{', '.join(sorted(extras)) or 'only a score'}); use one of {', '.join(SEQUENCE_METRICS)} or a key of "
                         "the dict your compute_score returns")
    text = next((v for v in extras[metric] if not isinstance(v, (int, float))), None)
    if text is not None:
        raise ValueError(f"algorithm.filter_groups.metric={metric} is not a number per sample (the reward function returned "
                         f"{text!r}); use one of {', '.join(SEQUENCE_METRICS)} or a numeric key of the dict compute_score returns")
    return np.asarray(extras[metric], dtype=np.float64)


class GroupCollector:
    """Accumulates the informative groups of successive generation batches for one training step."""

    def __init__(self, prompts_needed: int, samples_per_prompt: int, max_num_gen_batches: int) -> None:
        self.prompts_needed, self.n, self.max_batches = prompts_needed, samples_per_prompt, max_num_gen_batches
        self.parts: list[DataProto] = []
        self.num_gen_batches = 0
        self.num_groups_seen = 0

    def add(self, batch: DataProto, keep: np.ndarray) -> None:
        self.num_gen_batches += 1
        self.num_groups_seen += len(batch) // self.n
        if keep.any():
            self.parts.append(batch.index(np.flatnonzero(keep)))

    @property
    def prompts(self) -> int:
        return sum(len(p) for p in self.parts) // self.n

    def done(self) -> bool:
        """True once enough prompts are kept; raises when the batch limit is reached first."""
        if self.prompts >= self.prompts_needed:
            return True
        if 0 < self.max_batches <= self.num_gen_batches:
            raise RuntimeError(
                f"algorithm.filter_groups: {self.num_gen_batches} generation batches (max_num_gen_batches={self.max_batches}) "
                f"kept {self.prompts} of the {self.prompts_needed} prompts a step needs: in the other groups every sample "
                "scored the same (the data may be too hard or too easy for the model). Raise "
                "algorithm.filter_groups.max_num_gen_batches (0 = no limit) or data.gen_batch_size")
        return False

    def batch(self) -> DataProto:
        """The first train_batch_size kept groups (groups are contiguous: `rollout.n` samples each)."""
        return DataProto.concat(self.parts).index(np.arange(self.prompts_needed * self.n))
