"""The tiny_add task: row format, operand ranges, disjoint splits, parquet round trip, CLI."""

import pyarrow.parquet as pq
import pytest

from rlcore.data.synthetic import TASK_NAME, main, make_addition_rows, row_operands, write_parquet, write_task


def test_row_format():
    (row,) = make_addition_rows(1, 1, 2, seed=3, split="test")
    a, b = row_operands(row)
    answer = str(a + b)
    assert row == {
        "data_source": "tiny_add",
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "test", "index": 0, "answer": answer},
    }
    assert TASK_NAME == "tiny_add"


def test_operand_ranges_distinct_and_deterministic():
    rows = make_addition_rows(500, 2, 3, seed=0)
    pairs = [row_operands(r) for r in rows]
    assert len(set(pairs)) == 500
    assert all(10 <= x <= 999 for p in pairs for x in p)
    assert {len(str(x)) for p in pairs for x in p} == {2, 3}
    assert [r["extra_info"]["index"] for r in rows] == list(range(500))
    assert make_addition_rows(500, 2, 3, seed=0) == rows
    assert make_addition_rows(500, 2, 3, seed=1) != rows


def test_exclude_and_capacity():
    everything = {(a, b) for a in range(10) for b in range(10)}
    exclude = set(list(sorted(everything))[:30])
    rows = make_addition_rows(70, 1, 1, seed=0, exclude=exclude)
    assert {row_operands(r) for r in rows} == everything - exclude  # all 70 remaining pairs
    with pytest.raises(ValueError, match="only 70 pairs are left"):
        make_addition_rows(71, 1, 1, seed=0, exclude=exclude)
    with pytest.raises(ValueError, match="min_digits"):
        make_addition_rows(1, 3, 2, seed=0)


def test_write_task_disjoint_splits_and_sft(tmp_path):
    paths = write_task(str(tmp_path / "task"), num_train=300, num_test=50, min_digits=1, max_digits=2, seed=0)
    assert set(paths) == {"train", "test", "sft"}
    train = pq.read_table(paths["train"]).to_pylist()
    test = pq.read_table(paths["test"]).to_pylist()
    sft = pq.read_table(paths["sft"]).to_pylist()
    assert (len(train), len(test), len(sft)) == (300, 50, 300)
    assert not {row_operands(r) for r in train} & {row_operands(r) for r in test}
    assert {r["extra_info"]["split"] for r in train} == {"train"}
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    for train_row, sft_row in zip(train, sft):
        assert sft_row == {**train_row, "response": train_row["reward_model"]["ground_truth"]}
        a, b = row_operands(train_row)
        assert sft_row["response"] == str(a + b)


def test_write_parquet_round_trips_nested(tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "meta": {"k": 1}},
        {"prompt": [{"role": "user", "content": "v"}], "meta": {"k": 2}},
    ]
    path = write_parquet(rows, str(tmp_path / "sub" / "x.parquet"))
    assert pq.read_table(path).to_pylist() == rows
    with pytest.raises(ValueError, match="no rows"):
        write_parquet([], str(tmp_path / "empty.parquet"))


def test_cli(tmp_path, capsys):
    paths = main(["--out_dir", str(tmp_path), "--num_train", "20", "--num_test", "5", "--seed", "7"])
    assert pq.read_table(paths["train"]).num_rows == 20
    assert pq.read_table(paths["test"]).num_rows == 5
    assert "sft:" in capsys.readouterr().out
