"""GSM8K in verl's row format from a local copy of the raw dataset: what the GSM8K recipes and the scorer read."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcore.data.dataset import read_rows
from rlcore.data.gsm8k import INSTRUCTION, main, prepare
from rlcore.reward.scorers import default_compute_score

RAW = [{"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3 + 1200 = <<3+1200=1203>>1203\n#### 1,203"},
       {"question": "Half of 10?", "answer": "10 / 2 = 5\n#### 5"}]


def write_hf_layout(root, rows):
    """The layout `hf download openai/gsm8k --repo-type dataset` leaves: main/ and socratic/ parquet shards."""
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        for split in ("train", "test"):
            data = rows if config == "main" else [{**r, "question": "SOCRATIC " + r["question"]} for r in rows]
            pq.write_table(pa.Table.from_pylist(data), str(root / config / f"{split}-00000-of-00001.parquet"))


def test_rows_are_verls_and_the_scorer_grades_them(tmp_path, capsys):
    write_hf_layout(tmp_path / "raw", RAW)
    main(["--raw_dir", str(tmp_path / "raw"), "--out_dir", str(tmp_path / "gsm8k")])
    assert "wrote 2 train and 2 test rows" in capsys.readouterr().out
    rows, _ = read_rows([str(tmp_path / "gsm8k" / "train.parquet")])
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": f"{r['question']} {INSTRUCTION}"}] for r in RAW]  # main only
    assert [r["reward_model"] for r in rows] == [{"style": "rule", "ground_truth": "1203"}, {"style": "rule", "ground_truth": "5"}]
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["ability"] == "math"
    assert rows[1]["extra_info"] == {"split": "train", "index": 1, "answer": RAW[1]["answer"], "question": RAW[1]["question"]}
    truth = rows[0]["reward_model"]["ground_truth"]
    assert default_compute_score("openai/gsm8k", "so 3 + 1200 = 1203\n#### 1,203", truth) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 1202", truth) == 0.0


def test_the_original_jsonl_release_works_too(tmp_path):
    (tmp_path / "raw").mkdir()
    for split in ("train", "test"):
        (tmp_path / "raw" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RAW))
    assert prepare(str(tmp_path / "raw"), str(tmp_path / "out")) == {"train": 2, "test": 2}


def test_a_missing_copy_says_how_to_download_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="hf download openai/gsm8k --repo-type dataset --local-dir"):
        prepare(str(tmp_path), str(tmp_path / "out"))
