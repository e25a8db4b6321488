"""Turns decoded responses into token-level scores: the rule/custom score sits on each response's last token."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np
import torch

from rlcore.protocol import DataProto
from rlcore.reward.scorers import default_compute_score


class RewardManager:
    """verl's "naive" reward manager: one `compute_score` call per sample, on the controller."""

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None, reward_fn_key: str = "data_source") -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    def decode_responses(self, data: DataProto) -> list[str]:
        lengths = data.batch["response_mask"].sum(-1).tolist()
        return self.tokenizer.batch_decode([r[: int(n)] for r, n in zip(data.batch["responses"], lengths)], skip_special_tokens=True)

    def samples(self, data: DataProto, scores: torch.Tensor, limit: int) -> list[tuple[str, str, float]]:
        """(prompt, response, score) of the first `limit` rows, decoded for a human to read."""
        rows = data.index(list(range(min(limit, len(data)))))
        prompts = self.tokenizer.batch_decode(rows.batch["prompts"], skip_special_tokens=False)
        pad = self.tokenizer.pad_token or ""
        return [(p.replace(pad, ""), r, float(s)) for p, r, s in zip(prompts, self.decode_responses(rows), scores.sum(-1).tolist())]

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """Returns `token_level_scores` `[batch, response_len]` and any extra per-sample values the scorer returned.

        A scorer may return a float or a dict with a "score" key plus extras (logged as `reward_extra/<key>`).
        """
        mask = data.batch["response_mask"]
        scores = torch.zeros(mask.shape, dtype=torch.float32)
        extras: dict[str, list[float]] = defaultdict(list)
        texts = self.decode_responses(data)
        sources = data.non_tensor_batch[self.reward_fn_key]
        extra_info = data.non_tensor_batch.get("extra_info", np.full(len(data), None, dtype=object))
        for i, text in enumerate(texts):
            result = self.compute_score(
                data_source=sources[i], solution_str=text,
                ground_truth=data.non_tensor_batch["reward_model"][i]["ground_truth"], extra_info=extra_info[i],
            )
            if isinstance(result, dict):
                for key, value in result.items():
                    if key != "score":
                        extras[key].append(float(value))
                result = result["score"]
            last = int(mask[i].sum()) - 1
            if last >= 0:  # an empty response has no token to carry the score
                scores[i, last] = float(result)
        return scores, dict(extras)
