"""Asynchronous training on split pools (`actor_rollout_ref.hybrid_engine=False`): the rollout pool generates and
scores in a background thread of the controller while the trainer pool trains, and the trainer's weights reach the
rollout every `async_training.trigger_parameter_sync_step` steps.

Staleness is bounded by counting generation batches per sync window: between two syncs the rollouter makes at most
`staleness_window` trainer steps' worth (rlcore.config.async_schema), and the batches still queued at a sync count
against the next window, so no sample is ever more than that many windows old. Every sample carries the version
(trainer steps at the last sync) of the weights it was generated with; a step logs `async/staleness_{mean,max}` as
the trainer's version minus the samples'. With staleness_threshold=0, trigger_parameter_sync_step=1 the window is
one step: the rollouter makes one step's samples, waits for the sync, makes the next, which is the synchronous
trainer's order, step for step (tests/e2e/test_tiny_async.py checks the losses agree).

A sync streams the weights from training rank 0 to every rollout rank (rlcore.rollout.weight_sync.send_weights).
With `partial_rollout` it does not wait for the generation batch in flight: the rollout engine parks its sequences
at a decode step, loads the weights and goes on under them (rlcore.rollout.base.WeightGate; the native engine does,
vLLM finishes its call first), and each sample records the versions its generation started and ended under. Without
it the sync waits for the batch in flight to finish, with the rollouter paused.

verl 0.9's separate_async trainer mode is this loop (rlcore.config.async_schema.separate_async_keys). Its sampler's
`max_off_policy_strategy=drop` removes the groups of a step whose samples span more than `max_off_policy_threshold`
weight versions (a partial rollout resumed across syncs) and takes generation batches again in their place; `wait`
trains on them, as the rollouter's window already keeps every other sample within the bound.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from rlcore.config.async_schema import staleness_window
from rlcore.config.typed import dotted
from rlcore.protocol import DataProto


@dataclass
class Samples:
    """One generation batch, scored: its samples, the weights version they were generated with, its metrics."""

    batch: DataProto
    version: int
    metrics: dict[str, float]


class Rollouter:
    """Calls `produce(metrics) -> DataProto` (generate and score one batch) in a thread, as long as the current
    window has room (`capacity` batches per sync); the trainer `take`s whole batches in order."""

    def __init__(self, produce: Callable[[dict], DataProto], capacity: int) -> None:
        self.produce, self.capacity = produce, capacity
        self.queue: deque[Samples] = deque()
        self.cond = threading.Condition()
        self.version, self.made, self.busy, self.hold, self.stopped = 0, 0, False, 0, False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rollouter", daemon=True)

    def start(self, version: int) -> None:
        self.version = version
        self.thread.start()

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stopped or (not self.hold and self.made < self.capacity))
                if self.stopped:
                    return
                self.busy, self.made, version = True, self.made + 1, self.version
            try:
                metrics: dict[str, float] = {}
                samples = Samples(self.produce(metrics), version, metrics)
            except BaseException as err:  # noqa: BLE001 -- handed to the trainer's thread, which raises it
                with self.cond:
                    self.error, self.busy = err, False
                    self.cond.notify_all()
                return
            with self.cond:
                self.queue.append(samples)
                self.busy = False
                self.cond.notify_all()

    def take(self, count: int) -> tuple[list[Samples], float]:
        """The next `count` batches (waiting for them) and the seconds the trainer waited."""
        start = time.perf_counter()
        with self.cond:
            self.cond.wait_for(lambda: len(self.queue) >= count or self.error is not None)
            if self.error is not None:  # as raised (a dead rollout worker is a RayActorError: the restart path)
                raise self.error
            return [self.queue.popleft() for _ in range(count)], time.perf_counter() - start

    @contextmanager
    def paused(self, drain: bool = True) -> Iterator[None]:
        """Within it no generation batch starts; with `drain` none is in flight either (the one in flight finishes
        first), else the one in flight may go on."""
        with self.cond:
            self.hold += 1
            self.cond.wait_for(lambda: not (drain and self.busy))
        try:
            yield
        finally:
            with self.cond:
                self.hold -= 1
                self.cond.notify_all()

    def refill(self, batches: int) -> None:
        """Room in the window for `batches` more generation batches (replacing samples the trainer dropped)."""
        with self.cond:
            self.made -= batches
            self.cond.notify_all()

    def give_back(self, samples: Samples) -> None:
        """Samples the trainer took beyond its step: the next step takes them first."""
        with self.cond:
            self.queue.appendleft(samples)
            self.cond.notify_all()

    def synced(self, version: int) -> None:
        """New weights on the rollout: a new window, in which the batches still queued (or in flight) count already."""
        with self.cond:
            self.version, self.made = version, len(self.queue) + int(self.busy)
            self.cond.notify_all()

    def stop(self) -> None:
        """Ends the thread after the batch in flight (its samples are dropped with the queue's)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join()
        self.queue.clear()


def start_versions(samples: Samples) -> torch.Tensor:
    """The weights version each sample's generation started under: the engine's record, else its batch's."""
    if "rollout_versions" in samples.batch.batch.keys():
        return samples.batch.batch["rollout_versions"][:, 0]
    return torch.full((len(samples.batch),), samples.version)


def within_off_policy_bound(spans: np.ndarray, uids: np.ndarray, threshold: int) -> np.ndarray:
    """verl's drop rule, per prompt group: keep a group (all its samples) when every one of them spans at most
    `threshold` weight versions (`spans[i]` = the step it is trained at - the version it started under)."""
    stale = {uid for uid, span in zip(uids, spans) if span > threshold}
    return np.array([uid not in stale for uid in uids], dtype=bool)


class SplitPools:
    """The trainer's side of split pools: connects the pools' weight group, runs the rollouter, syncs weights."""

    def __init__(self, cfg, trainer_group, rollout_group, produce: Callable[[dict], DataProto]) -> None:
        a = cfg.async_training
        self.trainer_group, self.rollout_group = trainer_group, rollout_group
        self.trigger, self.partial = a.trigger_parameter_sync_step, a.partial_rollout
        self.batches_per_step = cfg.data.train_batch_size // cfg.data.gen_batch_size
        self.rollouter = Rollouter(produce, self.batches_per_step * staleness_window(dotted(cfg)))
        self.version = 0  # trainer steps at the last sync: the version of the rollout's weights
        sampler = cfg.trainer.v1.sampler
        # verl 0.9's separate_async with the drop strategy: the span a trained sample may have (None: keep all)
        dropping = cfg.trainer.v1.trainer_mode == "separate_async" and sampler.max_off_policy_strategy == "drop"
        self.max_span = sampler.max_off_policy_threshold if dropping else None

    def connect(self, step: int) -> dict[str, float]:
        """Joins the weight group and gives the rollout the trainer's weights (fresh or resumed)."""
        world = self.rollout_group.world_size + 1
        host, port = self.trainer_group.rank0_address()
        self._both(lambda: self.trainer_group.join_weight_group(host, port, world), lambda: self.rollout_group.join_weight_group(host, port, world))
        return self._send(step)

    def start(self) -> None:
        """Starts generating. After the validation before training: the scorer's process pool serves one thread
        at a time, so the rollouter and a validation never score at once (`quiet` pauses it for later ones)."""
        self.rollouter.start(self.version)

    def take(self, metrics: dict[str, float], step: int) -> DataProto:
        """The samples of trainer step `step`: whole generation batches, with their staleness and the rollout's metrics."""
        taken, waited = self.rollouter.take(self.batches_per_step)
        if self.max_span is not None:
            taken, dropped, more = self._drop_stale(taken, step)
            metrics["async/dropped_samples"], waited = dropped, waited + more
        for key in taken[0].metrics:  # the rollout's timings and counters: mean over the step's generation batches
            metrics[key] = float(np.mean([s.metrics.get(key, 0.0) for s in taken]))
        batch = DataProto.concat([s.batch for s in taken])
        # Each sample's weights versions (start, end) as the engine recorded them, else the batch's at its start.
        if "rollout_versions" in batch.batch.keys():
            versions = batch.pop(["rollout_versions"]).batch["rollout_versions"]
        else:
            versions = torch.tensor([[s.version, s.version] for s in taken for _ in range(len(s.batch))])
        staleness = (step - 1 - versions[:, 0]).float()
        metrics.update({"async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max()),
                        "async/partial_ratio": float((versions[:, 1] > versions[:, 0]).float().mean()),
                        "async/wait_for_samples_s": waited, "async/queued_batches": len(self.rollouter.queue),
                        "async/param_version": self.version})
        return batch

    def _drop_stale(self, taken: list[Samples], step: int) -> tuple[list[Samples], int, float]:
        """verl's drop strategy: the groups spanning more than max_span versions leave the step, and generation
        batches are taken in their place (the rollouter's window gets the room back) until the step has its rows;
        rows beyond them go back to the queue, whole groups, for the next step. (dropped samples, seconds waited)"""
        need, kept, dropped, waited = sum(len(s.batch) for s in taken), [], 0, 0.0
        queue = list(taken)
        while sum(len(s.batch) for s in kept) < need:
            if not queue:
                self.rollouter.refill(1)
                queue, more = self.rollouter.take(1)
                waited += more
            samples = queue.pop(0)
            keep = within_off_policy_bound((step - start_versions(samples)).numpy(), samples.batch.non_tensor_batch["uid"], self.max_span)
            dropped += int((~keep).sum())
            if keep.any():
                kept.append(Samples(samples.batch.index(np.flatnonzero(keep)), samples.version, samples.metrics))
        for samples in reversed(queue):  # taken for this step and not needed
            self.rollouter.give_back(samples)
        surplus = sum(len(s.batch) for s in kept) - need
        if surplus:  # the last batch's tail (whole groups: a group's n samples are adjacent) waits for the next step
            last = kept.pop()
            cut = len(last.batch) - surplus
            kept.append(Samples(last.batch.index(np.arange(cut)), last.version, last.metrics))
            self.rollouter.give_back(Samples(last.batch.index(np.arange(cut, len(last.batch))), last.version, last.metrics))
        return kept, dropped, waited

    def after_step(self, step: int, metrics: dict[str, float], validating: bool = False, last: bool = False) -> None:
        """Syncs every `trigger_parameter_sync_step` steps but after the last, and before a validation (which must
        see this step's weights)."""
        if (step % self.trigger == 0 and not last) or validating:
            self.sync(step, metrics)

    def sync(self, step: int, metrics: dict[str, float]) -> None:
        """The trainer's weights (after `step` steps) to the rollout, with the rollouter paused."""
        if self.version == step:
            return
        start = time.perf_counter()
        with self.rollouter.paused(drain=not self.partial):
            # Without partial rollouts, the wait for the generation batch in flight to finish.
            metrics["async/pause_s"] = time.perf_counter() - start
            metrics.update(self._send(step))
            self.rollouter.synced(step)

    def _send(self, step: int) -> dict[str, float]:
        sent, _ = self._both(self.trainer_group.send_weights, lambda: self.rollout_group.receive_weights(step))
        self.version = step
        return sent

    @staticmethod
    def _both(first: Callable, second: Callable) -> tuple:
        """Two group calls that meet in one collective: issued together, each from its own thread. The first
        error is raised at once: if a rollout rank died, the training side may still be waiting in the collective
        with it, and the restart path (which kills every worker) must not wait for that call to end."""
        pool = ThreadPoolExecutor(2, thread_name_prefix="weight-sync")
        calls = [pool.submit(first), pool.submit(second)]
        try:
            done, _ = wait(calls, return_when=FIRST_EXCEPTION)
            for call in done:
                if call.exception() is not None:
                    raise call.exception()
            return calls[0].result(), calls[1].result()
        finally:
            pool.shutdown(wait=False)

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """The rollout pool idle and up to date (validation generates there; a checkpoint records the version)."""
        if not self.rollouter.thread.is_alive():
            yield
            return
        with self.rollouter.paused():
            yield

    def close(self) -> None:
        self.rollouter.stop()
