"""verl's generation dumps: `trainer.rollout_data_dir` (training) and `trainer.validation_data_dir` (validation) get
`{global_step}.jsonl`, one JSON object per sample:

    {"input": prompt text, "output": response text, "gts": ground truth or null, "score": summed score,
     "step": global step, <each scorer extra, e.g. "acc", "pred">: its value}

The prompt is decoded with its special tokens (chat template) and without padding, as log_val_generations shows it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch

from rlcore.protocol import DataProto


def generation_records(reward_fn, batch: DataProto, scores: torch.Tensor, extras: dict[str, list[Any]], step: int) -> list[dict[str, Any]]:
    """One record per sample of a generated, scored batch; `reward_fn` (a RewardManager) decodes the text,
    `scores` `[batch, response_len]` are its token-level scores and `extras` its per-sample extras."""
    reward_rows = batch.non_tensor_batch.get("reward_model", [{}] * len(batch))
    records = []
    for i, (prompt, response, score) in enumerate(reward_fn.samples(batch, scores, len(batch))):
        record = {"input": prompt, "output": response, "gts": reward_rows[i].get("ground_truth"), "score": score, "step": step}
        record.update((key, values[i]) for key, values in extras.items())
        records.append(record)
    return records


def dump_generations(directory: str, step: int, reward_fn, batch: DataProto, scores: torch.Tensor, extras: dict[str, list[Any]],
                     fresh: bool = False) -> str:
    """Appends the batch's records to `{directory}/{step}.jsonl` (`fresh`: starts the file over); returns its path.

    Appending lets one step write several batches (validation batches, dynamic sampling's generation batches, the
    dropped groups included); validation starts its file fresh, so a step validated again replaces it, while a
    training step run again after a resume appends its generations a second time."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{step}.jsonl")
    with open(path, "w" if fresh else "a") as f:
        for record in generation_records(reward_fn, batch, scores, extras, step):
            f.write(json.dumps(record, default=_jsonable) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    """What json cannot write itself: numpy values (a ground-truth list read from parquet), anything else as text."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return str(value)
