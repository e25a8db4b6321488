"""GSM8K rows for the calculator recipe: a system turn first, ground truth, source and extra_info kept."""

import pytest

from rlcore.data.dataset import read_rows
from rlcore.data.gsm8k_tools import SYSTEM_PROMPT, convert, main
from rlcore.data.synthetic import write_parquet

ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2 apples and 3 more? Let's think step by step"}],
       "ability": "math", "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"split": "train", "index": 0}}


def test_rows_get_the_calculator_system_turn_and_keep_what_the_scorer_reads(tmp_path):
    for split in ("train", "test"):
        write_parquet([ROW, {**ROW, "prompt": [{"role": "system", "content": "old"}, *ROW["prompt"]]}], str(tmp_path / "in" / f"{split}.parquet"))
    main(["--in_dir", str(tmp_path / "in"), "--out_dir", str(tmp_path / "out")])
    rows, _ = read_rows([str(tmp_path / "out" / "train.parquet")])
    for row in rows:
        assert row["prompt"] == [{"role": "system", "content": SYSTEM_PROMPT}, ROW["prompt"][0]]  # an old system turn is replaced
        assert row["reward_model"] == ROW["reward_model"] and row["data_source"] == "openai/gsm8k"
        assert row["extra_info"] == ROW["extra_info"]


def test_missing_input_names_the_file_and_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.parquet not found: write verl's GSM8K parquet first"):
        convert(str(tmp_path), str(tmp_path / "out"))
