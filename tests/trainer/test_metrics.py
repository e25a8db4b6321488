"""Batch metrics: the multi-turn ones (turns, tool calls, errors, timeouts) from the agent loop's per-row columns."""

import torch

from rlcore.protocol import DataProto
from rlcore.trainer.metrics import multi_turn_metrics


def test_multi_turn_metrics_count_the_steps_tool_use():
    batch = DataProto.from_dict({"num_turns": torch.tensor([3, 1, 2, 2]), "tool_calls": torch.tensor([2, 0, 1, 3]),
                                 "tool_errors": torch.tensor([1, 0, 0, 0]), "tool_timeouts": torch.tensor([0, 0, 0, 1]),
                                 "truncated": torch.tensor([0, 0, 1, 0]), "tool_rewards": torch.tensor([0.5, 0.0, 0.0, 1.5])})
    metrics = multi_turn_metrics(batch)
    assert metrics == {"num_turns/mean": 2.0, "num_turns/max": 3.0, "num_turns/min": 1.0, "tool/calls": 6.0, "tool/errors": 1.0,
                       "tool/timeouts": 1.0, "tool/error_rate": 2 / 6, "tool/calls_per_trajectory": 1.5, "multi_turn/truncated_ratio": 0.25,
                       "tool/rewards_mean": 0.5}
    assert multi_turn_metrics(DataProto.from_dict({"responses": torch.zeros(2, 3)})) == {}
