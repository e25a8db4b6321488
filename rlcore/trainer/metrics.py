"""Batch statistics under verl's metric names (critic/score/mean, response_length/mean, ...)."""

from __future__ import annotations

import torch

from rlcore.algos.otb import variance_proxy_metrics
from rlcore.algos.value import explained_variance
from rlcore.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def data_metrics(batch: DataProto) -> dict[str, float]:
    b = batch.batch
    mask = b["response_mask"].bool()
    response_len = mask.sum(-1).float()
    prompt_len = b["attention_mask"][:, : b["prompts"].shape[-1]].sum(-1).float()
    max_response = b["responses"].shape[-1]
    max_prompt = b["prompts"].shape[-1]
    metrics = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    metrics.update(_stats("critic/returns", b["returns"][mask]))
    if "values" in b.keys():
        metrics.update(_stats("critic/values", b["values"][mask]))
        metrics["critic/vf_explained_var"] = explained_variance(b["values"], b["returns"], mask)
    metrics.update(_stats("response_length", response_len))
    metrics["response_length/clip_ratio"] = (response_len >= max_response).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = (prompt_len >= max_prompt).float().mean().item()
    return metrics


def multi_turn_metrics(batch: DataProto) -> dict[str, float]:
    """A multi-turn batch's turns and tool use: verl's num_turns/{mean,max,min}, the step's tool calls, errors and
    timeouts (totals, and per call: tool/error_rate), calls per trajectory, and the share of trajectories cut off by
    the response budget (multi_turn/truncated_ratio). Nothing for a single-turn batch."""
    b = batch.batch
    if "num_turns" not in b.keys():
        return {}
    calls = float(b["tool_calls"].sum())
    failures = float(b["tool_errors"].sum() + b["tool_timeouts"].sum())
    return {
        **_stats("num_turns", b["num_turns"]),
        "tool/calls": calls, "tool/errors": float(b["tool_errors"].sum()), "tool/timeouts": float(b["tool_timeouts"].sum()),
        "tool/error_rate": failures / max(calls, 1.0), "tool/calls_per_trajectory": b["tool_calls"].float().mean().item(),
        "multi_turn/truncated_ratio": b["truncated"].float().mean().item(), "tool/rewards_mean": b["tool_rewards"].float().mean().item(),
    }


def gradient_variance_metrics(batch: DataProto, grad_norm: float | None) -> dict[str, float]:
    """verl's `variance_proxy/*` (rlcore.algos.otb.variance_proxy_metrics) when the old-log-prob pass computed
    sum_pi_squared (actor.calculate_sum_pi_squared); nothing otherwise."""
    b = batch.batch
    if "sum_pi_squared" not in b.keys() or "old_log_probs" not in b.keys():
        return {}
    return variance_proxy_metrics(b["advantages"], b["response_mask"], b["old_log_probs"], b["sum_pi_squared"],
                                  b.get("rollout_is_weights", None), grad_norm)


def throughput_metrics(batch: DataProto, step_seconds: float, num_devices: int) -> dict[str, float]:
    total_tokens = int(batch.batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / step_seconds / num_devices,  # tokens per second per device
    }
