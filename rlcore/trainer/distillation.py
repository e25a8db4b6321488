"""The controller's side of on-policy distillation: routes each finished sample to its teacher (`distillation.
teacher_key`), asks the teacher group for its scores, and lays them into the batch as columns the actor's loss reads
(rlcore.workers.teacher.TEACHER_COLUMNS). The loss itself is rlcore.algos.distill, inside the actor's update."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
from omegaconf import DictConfig

from rlcore.algos.kl import kl_penalty
from rlcore.config.distill_schema import teacher_entries, teacher_of_rows
from rlcore.protocol import DataProto

SCORED_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]  # what a teacher's pass reads


class TeacherScoring:
    """Scores a step's samples with the teacher group (`group`, role "teacher"). On a pool of its own the teachers'
    pass runs beside the actor's old-log-prob and reference passes (`start`, then `finish` before the update needs
    the columns); sharing the actor's devices, it runs in turn."""

    def __init__(self, cfg: DictConfig, group) -> None:
        self.group = group
        self.teachers = teacher_entries(cfg)
        self.key = cfg.distillation.teacher_key
        self.overlaps = bool(cfg.distillation.n_gpus_per_node)  # its own devices: nothing of the actor's to wait for
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="teacher") if self.overlaps else None

    def teachers_of(self, batch: DataProto) -> list[str]:
        if len(self.teachers) == 1:
            return [next(iter(self.teachers))] * len(batch)
        if self.key not in batch.non_tensor_batch:
            raise ValueError(f"distillation.teacher_key={self.key}: the data has no such column, and {len(self.teachers)} "
                             f"teachers need it to choose each row's; columns: {sorted(batch.non_tensor_batch)}")
        return teacher_of_rows(list(batch.non_tensor_batch[self.key]), self.teachers, self.key)

    def start(self, batch: DataProto) -> Future | None:
        """Starts the teachers' pass on a copy of what it reads (the caller goes on adding columns to `batch`)."""
        if not self.overlaps:
            return None
        return self._pool.submit(self._score, self._inputs(batch), self.teachers_of(batch))

    def finish(self, batch: DataProto, metrics: dict[str, float], pending: Future | None = None) -> None:
        """Adds the teacher columns to `batch` in place (waiting for `pending`, or scoring now), with per teacher its
        share of the samples and the reverse KL of the rollout from it before the update (k3 of the rollout's own
        log-probs against the teacher's, token mean: the distance the step starts from)."""
        columns, scored_metrics = pending.result() if pending is not None else self._score(self._inputs(batch), self.teachers_of(batch))
        for key, value in columns.items():
            batch.batch[key] = value
        metrics.update(scored_metrics)

    def __call__(self, batch: DataProto, metrics: dict[str, float]) -> None:
        self.finish(batch, metrics, self.start(batch))

    @staticmethod
    def _inputs(batch: DataProto) -> DataProto:
        keys = SCORED_KEYS + [k for k in ("rollout_log_probs", "response_mask") if k in batch.batch.keys()]
        return batch.select(keys)

    def _score(self, batch: DataProto, names: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """One group call per teacher over the rows routed to it: the columns for the whole batch, and metrics."""
        names, columns, metrics = np.array(names), {}, {}
        for name in self.teachers:
            rows = np.flatnonzero(names == name)
            metrics[f"distillation/{name}/sample_share"] = len(rows) / len(batch)
            if not len(rows):
                continue
            scored = self.group.compute_teacher_log_prob(batch.index(rows).select(SCORED_KEYS), teacher=name)
            metrics.update(scored.meta_info.pop("timing", {}))
            for key, value in scored.batch.items():
                if key not in columns:
                    columns[key] = value.new_zeros((len(batch),) + tuple(value.shape[1:]))
                columns[key][torch.as_tensor(rows)] = value
            metrics.update(self._distance(batch.index(rows), scored, name))
        return columns, metrics

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    @staticmethod
    def _distance(rows: DataProto, scored: DataProto, name: str) -> dict[str, float]:
        if "rollout_log_probs" not in rows.batch.keys():
            return {}
        mask = rows.batch["response_mask"].float()
        k3 = kl_penalty(rows.batch["rollout_log_probs"], scored.batch["teacher_log_probs"], "k3")
        return {f"distillation/{name}/rollout_reverse_kl": float((k3 * mask).sum() / mask.sum().clamp(min=1))}


def tokenizer_mismatch(student, teacher) -> str | None:
    """Why a teacher cannot score the student's token ids (None when it can): the teacher reads the ids the student
    sampled, so both must map every id to the same token, with the same special tokens."""
    if len(student) != len(teacher):
        return f"its tokenizer has {len(teacher)} tokens, the student's {len(student)}"
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return f"its {name} is {getattr(teacher, name)}, the student's {getattr(student, name)}"
    if student.get_vocab() != teacher.get_vocab():
        differ = sorted(set(student.get_vocab().items()) ^ set(teacher.get_vocab().items()))[:3]
        return f"its vocabulary maps tokens to other ids (e.g. {differ})"
    return None
