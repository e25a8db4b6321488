"""PromptLoader: deterministic epochs, batch counts, exact resume."""

import numpy as np
import pytest
import torch

from rlcore.data.loader import PromptLoader


class RangeDataset:
    """Row i is {"x": tensor([i]), "i": i}: batches show exactly which rows they hold."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.tensor([i]), "i": i}


def rows_of(batch) -> list[int]:
    assert batch["x"][:, 0].tolist() == list(batch["i"])
    return batch["x"][:, 0].tolist()


def test_epoch_permutation_and_len():
    loader = PromptLoader(RangeDataset(10), batch_size=3, shuffle=True, seed=5)
    assert len(loader) == 3
    epoch0 = [rows_of(b) for b in loader]
    expected = np.random.default_rng(5).permutation(10)[:9].reshape(3, 3).tolist()
    assert epoch0 == expected
    epoch1 = [rows_of(b) for b in loader]
    assert epoch1 == np.random.default_rng(6).permutation(10)[:9].reshape(3, 3).tolist()
    assert loader.state_dict() == {"epoch": 2, "batch_index": 0}


def test_no_shuffle_and_keep_last():
    loader = PromptLoader(RangeDataset(7), batch_size=3, shuffle=False, seed=0, drop_last=False)
    assert len(loader) == 3
    assert [rows_of(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]


def stream(loader, num_batches):
    """The next num_batches batches across epochs, as row lists."""
    out = []
    while len(out) < num_batches:
        for batch in loader:
            out.append(rows_of(batch))
            if len(out) == num_batches:
                break
    return out


@pytest.mark.parametrize("stop_after", [1, 3, 4, 7])  # mid-epoch, exactly at an epoch end, next epoch
def test_resume_reproduces_uninterrupted_batches(stop_after):
    make = lambda: PromptLoader(RangeDataset(13), batch_size=4, shuffle=True, seed=11)  # noqa: E731
    reference = stream(make(), 10)

    first = make()
    assert stream(first, stop_after) == reference[:stop_after]
    state = first.state_dict()

    resumed = make()
    resumed.load_state_dict(state)
    assert stream(resumed, 10 - stop_after) == reference[stop_after:]


def test_errors():
    with pytest.raises(ValueError, match=r"5 rows.*data.train_batch_size=8"):
        PromptLoader(RangeDataset(5), batch_size=8, shuffle=True, seed=0)
    loader = PromptLoader(RangeDataset(8), batch_size=4, shuffle=True, seed=0)
    with pytest.raises(ValueError, match="batch_index=9"):
        loader.load_state_dict({"epoch": 0, "batch_index": 9})
    with pytest.raises(ValueError, match="missing"):
        loader.load_state_dict({"epoch": 0})
