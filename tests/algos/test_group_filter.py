"""DAPO's group filter (rlcore/algos/group_filter.py) against verl 0.9's own decision, written out from its
ReplayBuffer._dapo_filtered_keys: a group is filtered when it has more than one value and their np.std is exactly 0."""

import numpy as np
import pytest

from rlcore.algos.group_filter import informative_samples


def _verl_kept_uids(uids, values):
    """verl 0.9 (trainer/ppo/v1/replay_buffer.py): collect each uid's metric values; filtered = len > 1 and std == 0."""
    by_uid = {}
    for uid, value in zip(uids, values):
        by_uid.setdefault(uid, []).append(float(value))
    filtered = {uid for uid, vals in by_uid.items() if len(vals) > 1 and float(np.std(vals)) == 0.0}
    return set(by_uid) - filtered


@pytest.mark.parametrize("seed", range(4))
def test_the_kept_groups_are_verls(seed):
    """Random groups of 1-6 samples, shuffled (a group's samples need not be adjacent), binary, tied or real
    values, and a NaN now and then."""
    rng = np.random.default_rng(seed)
    uids, values = [], []
    for group in range(40):
        size = int(rng.integers(1, 7))
        kind = rng.integers(4)
        vals = [np.full(size, 1.0), rng.integers(0, 2, size).astype(float), rng.normal(size=size), np.full(size, 0.25)][kind]
        if rng.random() < 0.1:
            vals[0] = np.nan
        uids += [f"u{group}"] * size
        values += list(vals)
    order = rng.permutation(len(uids))
    uids, values = np.array(uids, dtype=object)[order], np.array(values)[order]
    keep = informative_samples(uids, values)
    kept = _verl_kept_uids(uids, values)
    assert keep.tolist() == [uid in kept for uid in uids]
    assert 0 < keep.mean() < 1


def test_a_group_of_one_and_a_group_with_a_nan_are_kept_an_all_equal_group_is_not():
    uids = np.array(["solo", "same", "same", "nan", "nan", "diff", "diff"], dtype=object)
    values = np.array([1.0, 0.5, 0.5, np.nan, 0.5, 0.0, 1.0])
    assert informative_samples(uids, values).tolist() == [True, False, False, True, True, True, True]
    assert informative_samples(np.array([], dtype=object), np.array([])).tolist() == []


def test_max_inflight_gen_batches_is_accepted_without_effect_but_must_be_positive():
    """verl 0.9's algorithm.filter_groups.max_inflight_gen_batches bounds its streaming buffer's concurrent refills;
    rlcore's loop has one generation batch in flight, so another value is reported as having no effect, and a
    non-positive one is refused as verl refuses it."""
    from rlcore.config import compose
    from rlcore.config.key_status import ineffective_settings
    from rlcore.config.validate import diagnose

    cfg = compose(["recipe=tiny_cpu_dapo", "algorithm.filter_groups.max_inflight_gen_batches=2"])
    assert diagnose(cfg)[1] == []
    assert [line.split(":")[0] for line in ineffective_settings(cfg)] == ["algorithm.filter_groups.max_inflight_gen_batches=2"]
    cfg = compose(["recipe=tiny_cpu_dapo", "algorithm.filter_groups.max_inflight_gen_batches=0"])
    assert diagnose(cfg)[1] == ["algorithm.filter_groups.max_inflight_gen_batches=0 must be a positive integer; use 1"]
