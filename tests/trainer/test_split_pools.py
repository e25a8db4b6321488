"""The rollouter's bound on staleness, its pause for syncs and its errors, with a fake `produce` (no Ray)."""

import threading
import time

import pytest
import torch

from rlcore.protocol import DataProto
from rlcore.trainer.split_pools import Rollouter


def batch(i: int) -> DataProto:
    return DataProto.from_dict({"x": torch.full((2, 1), i)})


def counting_producer(delay: float = 0.0):
    made = []

    def produce(metrics):
        time.sleep(delay)
        made.append(len(made))
        metrics["timing_s/gen"] = delay
        return batch(made[-1])

    return produce, made


def settle(condition, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_window_bounds_what_is_made_between_syncs():
    produce, made = counting_producer()
    r = Rollouter(produce, capacity=3)
    r.start(version=0)
    settle(lambda: len(r.queue) == 3)
    time.sleep(0.1)
    assert len(made) == 3  # the window is full: nothing more until a sync
    taken, _ = r.take(2)
    assert [int(s.batch.batch["x"][0]) for s in taken] == [0, 1] and {s.version for s in taken} == {0}
    time.sleep(0.1)
    assert len(made) == 3  # taking does not open the window; a sync does
    r.synced(1)  # one batch still queued counts against the new window
    settle(lambda: len(made) == 5)
    time.sleep(0.1)
    assert len(made) == 5 and [s.version for s in r.queue] == [0, 1, 1]
    r.stop()
    assert not r.thread.is_alive() and not r.queue


def test_window_of_one_step_is_the_synchronous_order():
    """capacity = one step's batches: every batch is made with the weights the trainer is about to update."""
    produce, made = counting_producer()
    r = Rollouter(produce, capacity=2)
    r.start(version=0)
    for step in range(1, 4):
        taken, _ = r.take(2)
        assert [s.version for s in taken] == [step - 1] * 2
        time.sleep(0.05)
        assert len(made) == 2 * step  # nothing made ahead of the sync
        r.synced(step)
    r.stop()


def test_pause_waits_for_the_batch_in_flight_and_holds_the_next():
    produce, made = counting_producer(delay=0.3)
    r = Rollouter(produce, capacity=10)
    r.start(version=0)
    settle(lambda: r.busy)
    start = time.monotonic()
    with r.paused():
        assert not r.busy and time.monotonic() - start > 0.1  # the one in flight finished first
        count = len(made)
        time.sleep(0.4)
        assert len(made) == count  # nothing starts while paused
    settle(lambda: len(made) > count)
    r.stop()


def test_an_error_in_the_rollouter_reaches_the_trainer_as_raised():
    class WorkerDied(RuntimeError):
        pass

    def produce(metrics):
        raise WorkerDied("rollout rank 0 died")

    r = Rollouter(produce, capacity=4)
    r.start(version=0)
    with pytest.raises(WorkerDied, match="rank 0 died"):
        r.take(1)
    with r.paused():  # and pausing (a checkpoint after the failure) does not hang
        pass
    r.stop()


def test_stop_ends_a_thread_waiting_for_room():
    produce, _ = counting_producer()
    r = Rollouter(produce, capacity=1)
    r.start(version=0)
    settle(lambda: len(r.queue) == 1)
    r.stop()
    assert not r.thread.is_alive() and threading.active_count() >= 1


def test_verl_0_9s_drop_strategy_replaces_the_groups_past_the_threshold_and_keeps_the_rest_in_order():
    """trainer.v1.sampler.max_off_policy_strategy=drop (verl 0.9's separate_async): a prompt group with a sample whose
    generation started more than max_off_policy_threshold versions before the step (a partial rollout resumed across
    syncs) leaves the step with its whole group; generation batches are taken in its place (the window gets the room
    back) and rows beyond the step go back to the queue, whole groups, for the next step."""
    import numpy as np

    from rlcore.trainer.split_pools import SplitPools, within_off_policy_bound

    assert within_off_policy_bound(np.array([1, 3, 1, 1]), np.array(["a", "a", "b", "b"]), 2).tolist() == [False, False, True, True]
    starts = iter([[0, 0, -5, -5], [3, 3, 3, 3], [3, 3, 3, 3]])  # the first batch's second group started long ago

    def produce(metrics):
        versions = torch.tensor([[start, 3] for start in next(starts)])
        metrics["timing_s/gen"] = 1.0
        return DataProto.from_dict({"rollout_versions": versions, "x": torch.arange(4)},
                                   {"uid": np.array(["p", "p", "q", "q"], dtype=object)})

    pools = SplitPools.__new__(SplitPools)
    pools.rollouter, pools.max_span = Rollouter(produce, capacity=2), 8
    pools.rollouter.start(version=0)
    settle(lambda: len(pools.rollouter.queue) == 2)
    taken, _ = pools.rollouter.take(1)
    kept, dropped, _ = pools._drop_stale(taken, step=4)  # group q started at version -5: 9 versions at step 4
    assert dropped == 2 and sum(len(s.batch) for s in kept) == 4
    assert [s.batch.non_tensor_batch["uid"].tolist() for s in kept] == [["p", "p"], ["p", "p"]]  # q replaced by a new batch's p
    assert [s.batch.non_tensor_batch["uid"].tolist() for s in pools.rollouter.queue][0] == ["q", "q"]  # its q: next step
    pools.rollouter.stop()
