import numpy as np
import pytest
import torch

from rlcore.protocol import DataProto


def make(n=4):
    return DataProto.from_dict(
        {"x": torch.arange(n * 2).view(n, 2), "y": torch.arange(n).float()},
        {"uid": [f"u{i}" for i in range(n)], "gt": [{"v": i} for i in range(n)]},
        {"temperature": 1.0},
    )


def test_from_dict_keeps_dicts_as_objects_and_checks_sizes():
    d = make()
    assert len(d) == 4 and d.non_tensor_batch["gt"][2] == {"v": 2}
    with pytest.raises(ValueError, match="disagree"):
        DataProto.from_dict({"x": torch.zeros(3)}, {"uid": ["a", "b"]})


def test_repeat_interleave_and_tile_keep_rows_aligned():
    d = make(2)
    inter = d.repeat(3, interleave=True)
    assert inter["y"].tolist() == [0, 0, 0, 1, 1, 1]
    assert list(inter["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    tiled = d.repeat(2, interleave=False)
    assert tiled["y"].tolist() == [0, 1, 0, 1] and list(tiled["uid"]) == ["u0", "u1", "u0", "u1"]


def test_chunk_concat_roundtrip_and_uneven_chunk_rejected():
    d = make(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    back = DataProto.concat(parts)
    assert torch.equal(back["x"], d["x"]) and list(back["uid"]) == list(d["uid"])
    with pytest.raises(ValueError, match="pad"):
        d.chunk(4)


def test_pad_to_multiple_then_unpad():
    d = make(5)
    padded, num_pad = d.pad_to_multiple(4)
    assert len(padded) == 8 and num_pad == 3
    assert padded["y"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert torch.equal(padded.unpad(num_pad)["x"], d["x"])


def test_reorder_permutes_tensor_and_non_tensor_together():
    d = make(3).reorder([2, 0, 1])
    assert d["y"].tolist() == [2, 0, 1] and list(d["uid"]) == ["u2", "u0", "u1"]
    with pytest.raises(ValueError, match="permutation"):
        make(3).reorder([0, 0, 1])


def test_select_pop_union():
    d = make(3)
    sel = d.select(["x"], ["uid"])
    assert list(sel.batch.keys()) == ["x"] and list(sel.non_tensor_batch) == ["uid"]
    popped = d.pop(["y"])
    assert "y" not in d and torch.equal(popped["y"], torch.tensor([0.0, 1.0, 2.0]))
    d.union(DataProto.from_dict({"z": torch.ones(3)}, {"uid": ["u0", "u1", "u2"]}))
    assert torch.equal(d["z"], torch.ones(3))
    with pytest.raises(ValueError, match="differs"):
        d.union(DataProto.from_dict({"z": torch.zeros(3)}))
    with pytest.raises(ValueError, match="rows"):
        d.union(make(2))


def test_split_last_piece_shorter_and_index_order():
    d = make(5)
    assert [len(p) for p in d.split(2)] == [2, 2, 1]
    assert d.index(np.array([4, 4, 0]))["y"].tolist() == [4, 4, 0]
