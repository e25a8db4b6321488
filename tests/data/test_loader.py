"""PromptLoader: deterministic epochs, batch counts, exact resume; a custom sampler (data.sampler) in its place."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlcore.data.loader import PromptLoader
from rlcore.data.sampler import build_sampler
from rlcore.protocol import DataProto


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


SAMPLER_FILE = str(Path(__file__).with_name("curriculum_sampler.py"))


def sampler_cfg(class_path=SAMPLER_FILE, class_name="HardestFirstSampler"):
    return OmegaConf.create({"sampler": {"class_path": class_path, "class_name": class_name}})


def scored(rows: list[int], scores: list[float]) -> DataProto:
    batch = DataProto.from_dict({"token_level_scores": torch.tensor(scores)[:, None]})
    batch.non_tensor_batch["index"] = np.array(rows, dtype=object)
    return batch


def test_a_curriculum_sampler_orders_the_epochs_from_the_scores_it_is_told():
    """data.sampler: verl's interface, duck-typed. The loader draws each batch from the sampler; update() between
    steps changes the next epoch's order (this sampler fixes an epoch's order when it starts)."""
    sampler = build_sampler(sampler_cfg(), RangeDataset(6))
    loader = PromptLoader(RangeDataset(6), batch_size=2, shuffle=True, seed=0, sampler=sampler)
    assert len(loader) == 3
    epoch0 = []
    for batch in loader:
        epoch0.append(rows_of(batch))
        loader.update(scored(rows_of(batch), [1.0 if r % 2 else 0.5 for r in rows_of(batch)]))
    assert epoch0 == [[0, 1], [2, 3], [4, 5]]  # nothing scored yet: by row (data.shuffle is the sampler's business)
    assert [rows_of(b) for b in loader] == [[0, 2], [4, 1], [3, 5]]  # the lower scores (even rows) first


def test_a_stateful_sampler_resumes_with_the_loader():
    """The loader's state carries the sampler's (state_dict), and a resumed loader skips what the epoch drew."""
    straight_sampler = build_sampler(sampler_cfg(), RangeDataset(6))
    straight = PromptLoader(RangeDataset(6), batch_size=2, shuffle=False, seed=0, sampler=straight_sampler)
    it = iter(straight)
    first = rows_of(next(it))
    straight.update(scored(first, [0.0, 1.0]))
    state = straight.state_dict()
    assert state["sampler"]["order"] == [0, 1, 2, 3, 4, 5] and state["batch_index"] == 1
    rest = [rows_of(b) for b in it] + [rows_of(b) for b in straight]
    resumed = PromptLoader(RangeDataset(6), batch_size=2, shuffle=False, seed=0, sampler=build_sampler(sampler_cfg(), RangeDataset(6)))
    resumed.load_state_dict(state)
    assert [rows_of(b) for b in resumed] + [rows_of(b) for b in resumed] == rest
    assert rest[-3:] == [[0, 2], [3, 4], [5, 1]]  # epoch 1: row 1 scored 1.0, the rest 0


def test_a_sampler_is_found_by_module_too_and_bad_classes_are_named(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert type(build_sampler(sampler_cfg("pkg://curriculum_sampler"), RangeDataset(3))).__name__ == "HardestFirstSampler"
    with pytest.raises(ValueError, match=r"data.sampler.class_name='Missing' is not a class in .*curriculum_sampler.py; classes "
                                         r"defined there: \['HardestFirstSampler', 'NotASampler'\]"):
        build_sampler(sampler_cfg(class_name="Missing"), RangeDataset(3))
    with pytest.raises(TypeError, match=r"NotASampler lacks __iter__, __len__"):
        build_sampler(sampler_cfg(class_name="NotASampler"), RangeDataset(3))
    with pytest.raises(ImportError, match=r"data.sampler.class_path=pkg://no_such_module_here: module no_such_module_here cannot be imported"):
        build_sampler(sampler_cfg("pkg://no_such_module_here"), RangeDataset(3))
    assert build_sampler(sampler_cfg(None, None), RangeDataset(3)) is None
