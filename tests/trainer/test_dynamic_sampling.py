"""DAPO's dynamic sampling: only groups whose scores differ are kept, whole and in order, until a step is full."""

import numpy as np
import pytest
import torch

from rlcore.algos.group_filter import informative_samples
from rlcore.protocol import DataProto
from rlcore.trainer.dynamic_sampling import GroupCollector, sample_metric


def scored_batch(group_scores: list[list[float]], tag: int = 0) -> DataProto:
    """One row per sample, groups contiguous; the score sits on the last of 3 response tokens."""
    rows = [(g, s) for g, scores in enumerate(group_scores) for s in scores]
    scores = torch.zeros(len(rows), 3)
    scores[:, -1] = torch.tensor([s for _, s in rows])
    uids = np.array([f"{tag}-{g}" for g, _ in rows], dtype=object)
    return DataProto.from_dict({"token_level_scores": scores, "row": torch.arange(len(rows)) + 100 * tag}, {"uid": uids})


def test_groups_with_equal_scores_are_dropped_and_singletons_kept():
    batch = scored_batch([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5]])
    keep = informative_samples(batch.non_tensor_batch["uid"], sample_metric(batch, "seq_reward", {}))
    assert keep.tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True]


def test_scorer_extras_as_the_metric_and_a_missing_one_named():
    batch = scored_batch([[1, 0]])
    assert sample_metric(batch, "acc", {"acc": [1.0, 1.0]}).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"metric=acc is not a value the reward function returned \(it returned pred\)"):
        sample_metric(batch, "acc", {"pred": [3.0, 4.0]})
    with pytest.raises(ValueError, match=r"metric=pred is not a number per sample \(the reward function returned '7'\)"):
        sample_metric(batch, "pred", {"pred": ["7", "8"]})  # the extracted answers every rule scorer now returns


def test_collector_fills_the_step_with_whole_groups_from_several_batches():
    collector = GroupCollector(prompts_needed=3, samples_per_prompt=2, max_num_gen_batches=0)
    for tag, groups in enumerate(([[1, 1], [0, 1]], [[0, 0], [1, 0], [0, 0]], [[1, 0], [0, 1]])):
        batch = scored_batch(groups, tag)
        collector.add(batch, informative_samples(batch.non_tensor_batch["uid"], sample_metric(batch, "seq_reward", {})))
        if collector.done():
            break
    assert collector.num_gen_batches == 3 and collector.num_groups_seen == 7
    out = collector.batch()
    # kept: batch 0 group 1, batch 1 group 1, then the first group of batch 2 (the second one is cut)
    assert out.batch["row"].tolist() == [2, 3, 102, 103, 200, 201]
    assert all(np.std(out.batch["token_level_scores"].sum(-1)[i : i + 2].numpy()) > 0 for i in range(0, 6, 2))


def test_collector_stops_the_run_after_max_num_gen_batches():
    collector = GroupCollector(prompts_needed=2, samples_per_prompt=2, max_num_gen_batches=2)
    for tag in range(2):
        batch = scored_batch([[0, 0], [0, 1]], tag)
        collector.add(batch, informative_samples(batch.non_tensor_batch["uid"], sample_metric(batch, "seq_reward", {})))
    assert collector.prompts == 2 and collector.done()
    collector = GroupCollector(prompts_needed=3, samples_per_prompt=2, max_num_gen_batches=2)
    for tag in range(2):
        batch = scored_batch([[0, 0], [0, 1]], tag)
        collector.add(batch, informative_samples(batch.non_tensor_batch["uid"], sample_metric(batch, "seq_reward", {})))
    with pytest.raises(RuntimeError, match=r"2 generation batches \(max_num_gen_batches=2\) kept 2 of the 3 prompts"):
        collector.done()
