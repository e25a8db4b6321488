"""Turns decoded responses into token-level scores: the rule/custom score sits on each response's last token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from rlcore.protocol import DataProto, response_lengths
from rlcore.reward.isolation import IsolatedScorer, ScoreFailure
from rlcore.reward.scorers import answer_extractor, default_compute_score


def decode_responses(tokenizer, data: DataProto) -> list[str]:
    """Each response's text: its valid tokens (up to the stop token; a multi-turn trajectory's tool responses
    included) without special tokens."""
    lengths = response_lengths(data.batch).tolist()
    return tokenizer.batch_decode([r[: int(n)] for r, n in zip(data.batch["responses"], lengths)], skip_special_tokens=True)


@dataclass
class ScoreGuard:
    """What a failed score costs (reward_model.error_score) and how many failures a step tolerates
    (reward_model.max_error_rate: the fraction of its samples) before the run stops."""

    error_score: float = 0.0
    max_error_rate: float = 0.1


def _extra_value(value: Any) -> Any:
    """A scorer's extra as the manager returns it: a number as a float, anything else unchanged."""
    return float(value) if isinstance(value, (bool, int, float, np.number)) else value


class RewardManager:
    """verl's "naive" reward manager: one `compute_score` call per sample, each isolated (rlcore.reward.isolation):
    a sample whose scorer raises or times out gets `guard.error_score`, counted in reward/errors and
    reward/timeouts; the first message is printed once."""

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None, reward_fn_key: str = "data_source",
                 scorer: IsolatedScorer | None = None, guard: ScoreGuard | None = None) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.scorer = scorer or IsolatedScorer(self.compute_score, None, "compute_score", workers=0, timeout_s=math.inf)
        self.guard = guard or ScoreGuard()
        self.health: dict[str, float] = {}
        self.reported = False

    def close(self) -> None:
        self.scorer.close()

    def decode_responses(self, data: DataProto) -> list[str]:
        return decode_responses(self.tokenizer, data)

    def samples(self, data: DataProto, scores: torch.Tensor, limit: int) -> list[tuple[str, str, float]]:
        """(prompt, response, score) of the first `limit` rows, decoded for a human to read."""
        rows = data.index(list(range(min(limit, len(data)))))
        prompts = self.tokenizer.batch_decode(rows.batch["prompts"], skip_special_tokens=False)
        pad = self.tokenizer.pad_token or ""
        return [(p.replace(pad, ""), r, float(s)) for p, r, s in zip(prompts, self.decode_responses(rows), scores.sum(-1).tolist())]

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """Returns `token_level_scores` `[batch, response_len]` and the extra per-sample values, one list per key.

        A scorer may return a float or a dict with a "score" key plus extras (logged as `reward_extra/<key>`):
        numbers become floats, anything else (the extracted answer "pred", a label) passes through as it is. Without
        a "pred" from the scorer, the answer extractor registered for the sample's data_source supplies it. A key
        some samples lack (a failed score, an extractor for one source only) is None for them.
        With a reward model (`rm_scores` in the batch) its scores are the scores, as in verl's naive manager: the
        rule scorer is not called (validation batches carry no rm_scores and are scored by the rules).
        """
        if "rm_scores" in data.batch.keys():
            return data.batch["rm_scores"].clone(), {}
        lengths = response_lengths(data.batch)
        scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        texts = self.decode_responses(data)
        sources = data.non_tensor_batch[self.reward_fn_key]
        extra_info = self.extra_infos(data)
        truths = [row["ground_truth"] for row in data.non_tensor_batch["reward_model"]]
        # An agent loop that scored its own trajectory (verl's AgentLoopOutput.reward_score): that score, unscored here.
        given = data.batch["agent_reward"].tolist() if "agent_reward" in data.batch.keys() else [math.nan] * len(texts)
        todo = [i for i, g in enumerate(given) if math.isnan(g)]
        requests = [dict(data_source=sources[i], solution_str=texts[i], ground_truth=truths[i], extra_info=extra_info[i]) for i in todo]
        # The step's tolerance goes to the scorer so that it stops at the failure that passes it: a hung scorer then
        # costs at most max_failures + 1 timeouts, not one per sample queued behind score_workers processes.
        results: list[Any] = list(given)
        for i, result in zip(todo, self.check_failures(self.scorer.score_all(requests, self.max_failures(len(requests))))):
            results[i] = result
        per_sample: list[dict[str, Any]] = []
        for i, result in enumerate(results):
            sample_extras = {}
            if isinstance(result, dict):
                sample_extras = {key: _extra_value(value) for key, value in result.items() if key != "score"}
                result = result["score"]
            extract = answer_extractor(sources[i])
            if "pred" not in sample_extras and extract is not None:
                sample_extras["pred"] = extract(texts[i])
            length = int(lengths[i])
            score = self.shape_score(float(result), length, sample_extras)
            per_sample.append(sample_extras)
            if length > 0:  # an empty response has no token to carry the score
                scores[i, length - 1] = score
        keys = dict.fromkeys(key for sample_extras in per_sample for key in sample_extras)  # first-seen order
        return scores, {key: [sample_extras.get(key) for sample_extras in per_sample] for key in keys}

    def extra_infos(self, data: DataProto) -> Any:
        """The `extra_info` handed to the scorer with each sample: the row's own, plus what the rollout measured."""
        extra_info = data.non_tensor_batch.get("extra_info", np.full(len(data), None, dtype=object))
        if "tool_rewards" in data.batch.keys():  # multi-turn: the tools' step rewards, for a scorer that adds them
            extra_info = [dict(info or {}, tool_rewards=float(r)) for info, r in zip(extra_info, data.batch["tool_rewards"].tolist())]
        if "turn_scores" in data.non_tensor_batch:  # an interaction's score of each of its turns, in order (verl's)
            extra_info = [dict(info or {}, turn_scores=list(s)) for info, s in zip(extra_info, data.non_tensor_batch["turn_scores"])]
        return extra_info

    def shape_score(self, score: float, response_length: int, extras: dict[str, Any]) -> float:
        """A manager's adjustment of one sample's score (may add logged extras); naive: none."""
        return score

    def max_failures(self, num_samples: int) -> int:
        """The most failed samples a step of num_samples tolerates: failures > rate x n  <=>  failures > floor(rate x n)
        (failures are whole); the small epsilon keeps 0.3 x 10 = 3.0000000000000004 from counting as 3.0...04."""
        return math.floor(self.guard.max_error_rate * num_samples + 1e-9)

    def check_failures(self, results: list[Any]) -> list[Any]:
        """Failed samples score guard.error_score; sets `health` (reward/errors, reward/timeouts) and stops the run
        when a step's failures pass guard.max_error_rate (the scorer stopped there, leaving later samples None)."""
        failures = [r for r in results if isinstance(r, ScoreFailure)]
        errors = sum(f.kind == "error" for f in failures)
        self.health = {"reward/errors": float(errors), "reward/timeouts": float(len(failures) - errors)}
        if not failures:
            return results
        first = failures[0]
        if len(failures) > self.max_failures(len(results)):
            unscored = sum(r is None for r in results)
            stopped = f" (scoring stopped there; {unscored} samples were not scored)" if unscored else ""
            raise RuntimeError(f"{errors} scorer errors and {len(failures) - errors} timeouts in {len(results)} samples: more than "
                               f"reward_model.max_error_rate={self.guard.max_error_rate:g} of the step{stopped}. First: {first.message}. "
                               "Fix compute_score, or raise reward_model.max_error_rate / reward_model.score_timeout_s")
        if not self.reported:
            print(f"WARNING: compute_score failed ({first.kind}): {first.message}; the sample scores reward_model.error_score="
                  f"{self.guard.error_score:g}, and later failures are only counted (reward/errors, reward/timeouts)", flush=True)
            self.reported = True
        return [self.guard.error_score if isinstance(r, ScoreFailure) else r for r in results]


class DapoRewardManager(RewardManager):
    """verl's "dapo" manager: the naive score plus DAPO's soft overlong punishment (`reward.reward_kwargs`).

    With `overlong_buffer_cfg.enable`, a response longer than `max_resp_len - len` tokens loses
    `penalty_factor * excess / len`: 0 at the buffer's start, -penalty_factor at max_resp_len. `log` adds the
    per-sample `overlong_reward` and `overlong` (0/1) to the reward extras.
    """

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None, reward_fn_key: str = "data_source",
                 scorer: IsolatedScorer | None = None, guard: ScoreGuard | None = None,
                 max_resp_len: int | None = None, overlong_buffer_cfg: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, compute_score, reward_fn_key, scorer, guard)
        self.max_resp_len = max_resp_len
        self.overlong = dict(overlong_buffer_cfg or {})

    def shape_score(self, score: float, response_length: int, extras: dict[str, Any]) -> float:
        if not self.overlong.get("enable", False):
            return score
        buffer = self.overlong["len"]
        excess = response_length - (self.max_resp_len - buffer)
        penalty = min(-excess / buffer * self.overlong["penalty_factor"], 0.0)
        if self.overlong.get("log", False):
            extras["overlong_reward"] = penalty
            extras["overlong"] = float(excess > 0)
        return score + penalty


def component_columns(extras: dict[str, list[Any]], keys: list[str], error_score: float) -> dict[str, np.ndarray]:
    """The scorer's per-sample values at `keys` (algorithm.gdpo_reward_keys) as float columns `[samples]`, for the batch's
    non-tensor columns, where they travel with their samples through group filtering and balancing to GDPO. A sample
    without the value (its scorer failed, so it scored reward_model.error_score) scores error_score there too."""
    missing = [key for key in keys if key not in extras]
    if missing:
        raise ValueError(f"algorithm.gdpo_reward_keys names {', '.join(missing)}, which the reward function did not return (it "
                         f"returned {', '.join(sorted(extras)) or 'only a score'}); return a dict with those keys from compute_score")
    return {key: np.array([error_score if v is None else float(v) for v in extras[key]], dtype=np.float64) for key in keys}


class GdpoRewardManager(RewardManager):
    """verl's "gdpo" manager: the naive manager's scores, with every key of a returned dict kept per sample (GDPO's
    components, algorithm.gdpo_reward_keys, are read from them), and each sample's `extra_info` also carrying
    `experiment_name` (trainer.experiment_name), which verl's GDPO example scorer reads to pick the chat format."""

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None, reward_fn_key: str = "data_source",
                 scorer: IsolatedScorer | None = None, guard: ScoreGuard | None = None, experiment_name: str = "") -> None:
        super().__init__(tokenizer, compute_score, reward_fn_key, scorer, guard)
        self.experiment_name = experiment_name

    def extra_infos(self, data: DataProto) -> list[dict[str, Any]]:
        return [dict(info or {}, experiment_name=self.experiment_name) for info in super().extra_infos(data)]


REWARD_MANAGERS = {"naive": RewardManager, "dapo": DapoRewardManager, "gdpo": GdpoRewardManager}  # reward.reward_manager.name


def build_reward_manager(name: str, tokenizer, compute_score, reward_fn_key: str, reward_kwargs: dict[str, Any],
                         scorer: IsolatedScorer | None = None, guard: ScoreGuard | None = None) -> RewardManager:
    """`reward.reward_manager.name` by name (the validator has checked the name and the kwargs)."""
    return REWARD_MANAGERS[name](tokenizer, compute_score, reward_fn_key, scorer, guard, **reward_kwargs)
