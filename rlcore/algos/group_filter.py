"""DAPO's group filter (`algorithm.filter_groups`): which prompt groups carry a learning signal.

A group whose samples all score the same has zero advantage under GRPO-style estimators: it costs a full update and
teaches nothing. The decision is verl 0.9's (trainer/ppo/v1/replay_buffer.py): a group is dropped exactly when it has
more than one sample and the population std of its metric is 0; everything else (a group of one sample, a group with
a NaN, whose std is NaN) is kept. rlcore.trainer.dynamic_sampling draws generation batches until enough are kept.
"""

from __future__ import annotations

import numpy as np


def informative_samples(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Boolean mask `[samples]`: True for every sample of a group kept by the filter, False for the samples of a group
    of 2+ whose `values` `[samples]` (the filter metric, one per sample) are all equal. `uids` `[samples]` name each
    sample's group (the prompt's uid); a group's samples need not be contiguous."""
    keep = np.ones(len(uids), dtype=bool)
    _, group_of = np.unique(uids, return_inverse=True)
    for group in range(group_of.max() + 1 if len(uids) else 0):
        members = group_of == group
        group_values = values[members]
        if len(group_values) > 1 and float(np.std(group_values)) == 0.0:
            keep[members] = False
    return keep
