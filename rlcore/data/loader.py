"""PromptLoader: a deterministic, resumable batch iterator over a map-style dataset (no worker processes).

Epoch e visits the rows in the order `np.random.default_rng(seed + e).permutation(n)` (or 0..n-1 without
shuffle), so the whole schedule is a pure function of (seed, epoch, batch_index) and resuming needs only those.
A custom sampler (data.sampler, rlcore.data.sampler) decides the order instead, asked for each batch's indices as
the batch is drawn, so a curriculum that update()s between steps changes what comes next.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rlcore.data.dataset import collate_fn as default_collate_fn


class PromptLoader:
    """Yields collated batches of `batch_size` rows; one `for` loop over it is one epoch.

    `state_dict()` taken between batches records how far the current epoch got; a new loader given that state
    continues with exactly the batches an uninterrupted loader would have produced next. Use one live iterator
    at a time: the iterator advances the loader's own position.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
        collate_fn: Callable[[list[dict[str, Any]]], dict[str, Any]] = default_collate_fn,
        batch_key: str = "data.train_batch_size",  # the key that set batch_size, for error messages
        sampler: Any = None,  # a custom order (rlcore.data.sampler): iterable of row indices, sized
    ) -> None:
        self.sampler = sampler
        num_rows = len(sampler) if sampler is not None else len(dataset)
        if batch_size <= 0:
            raise ValueError(f"{batch_key} must be positive, got {batch_size}")
        if num_rows < batch_size:
            raise ValueError(
                f"the dataset has {num_rows} rows, fewer than one batch ({batch_key}={batch_size}); "
                f"lower {batch_key} to at most {num_rows} or use a larger dataset"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.epoch = 0
        self.batch_index = 0  # batches of `epoch` already handed out

    def __len__(self) -> int:
        """Batches per epoch."""
        num_rows = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return num_rows // self.batch_size if self.drop_last else -(-num_rows // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Row indices of `epoch` in visiting order: int64[num_rows]."""
        num_rows = len(self.dataset)
        if not self.shuffle:
            return np.arange(num_rows)
        return np.random.default_rng(self.seed + epoch).permutation(num_rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yields the rest of the current epoch, then moves to the next epoch."""
        self._roll_over_finished_epoch()
        indices = self._indices(self.epoch, skip=self.batch_index * self.batch_size)
        while self.batch_index < len(self):
            batch = list(itertools.islice(indices, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):  # a sampler yielded fewer than its len()
                break
            # Count the batch before yielding it: a state_dict() taken while the consumer holds this batch
            # must say it has been handed out, or a resume would repeat it.
            self.batch_index += 1
            yield self.collate_fn([self.dataset[int(i)] for i in batch])
        self.batch_index = max(self.batch_index, len(self))
        self._roll_over_finished_epoch()

    def _indices(self, epoch: int, skip: int) -> Iterator[int]:
        """The epoch's row indices past the first `skip`; a sampler's drawn lazily. On resume a sampler is iterated
        afresh and the epoch's drawn indices skipped: its order is reproduced where it depends only on its own
        state (saved with the loader's when it has state_dict()) and the epoch (set_epoch)."""
        if self.sampler is None:
            return iter(self.epoch_order(epoch)[skip:].tolist())
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        return itertools.islice(iter(self.sampler), skip, None)

    def update(self, batch: Any) -> None:
        """A curriculum sampler's update(batch) with a step's scored batch (verl's AbstractCurriculumSampler)."""
        if callable(getattr(self.sampler, "update", None)):
            self.sampler.update(batch=batch)

    def _roll_over_finished_epoch(self) -> None:
        if self.batch_index >= len(self):
            self.epoch += 1
            self.batch_index = 0

    def state_dict(self) -> dict[str, Any]:
        """{"epoch", "batch_index"}: the next batch to produce (a finished epoch reads as the next one's start); and a
        sampler's own state_dict() under "sampler" when it has one."""
        state: dict[str, Any] = {"epoch": self.epoch, "batch_index": self.batch_index}
        if self.batch_index >= len(self):
            state = {"epoch": self.epoch + 1, "batch_index": 0}
        if callable(getattr(self.sampler, "state_dict", None)):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        missing = {"epoch", "batch_index"} - set(state)
        if missing:
            raise ValueError(f"loader state is missing {sorted(missing)}; got keys {sorted(state)}")
        epoch, batch_index = int(state["epoch"]), int(state["batch_index"])
        if epoch < 0 or not 0 <= batch_index <= len(self):
            raise ValueError(
                f"loader state epoch={epoch}, batch_index={batch_index} does not fit {len(self)} batches per epoch; "
                f"was the checkpoint written with a different dataset or batch size?"
            )
        self.epoch, self.batch_index = epoch, batch_index
        if "sampler" in state and callable(getattr(self.sampler, "load_state_dict", None)):
            self.sampler.load_state_dict(state["sampler"])
        self._roll_over_finished_epoch()
