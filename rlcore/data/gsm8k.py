"""GSM8K in verl's row format, the files the GSM8K recipes read (`data.train_files=~/data/gsm8k/train.parquet`).

The same rows as verl's examples/data_preprocess/gsm8k.py: the question with verl's instruction appended as one user
turn, the number after `####` in the reference solution as the rule scorer's ground truth, data_source
`openai/gsm8k` (rlcore's GSM8K scorer, rlcore/reward/scorers.py). The raw dataset comes from a local copy, so the
step that needs the network is one command you can run anywhere:

    hf download openai/gsm8k --repo-type dataset --local-dir ~/data/gsm8k_raw     # main/{train,test}-*.parquet
    python -m rlcore.data.gsm8k --raw_dir ~/data/gsm8k_raw --out_dir ~/data/gsm8k

`--raw_dir` may also hold the original release's train.jsonl / test.jsonl (github.com/openai/grade-school-math).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import pyarrow.parquet as pq

from rlcore.data.converters import converter_main, write_splits

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def ground_truth(solution: str) -> str:
    """The final answer of a GSM8K reference solution: the text after its last `####`, without thousands separators."""
    if "####" not in solution:
        raise ValueError(f"a GSM8K solution without '#### <answer>': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_row(question: str, solution: str, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth(solution)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def raw_split(raw_dir: str, split: str) -> list[dict[str, str]]:
    """The raw {question, answer} records of a split from a local copy of the dataset (parquet or jsonl)."""
    root = os.path.expanduser(raw_dir)
    parquet = sorted(glob.glob(os.path.join(root, "**", f"{split}-*.parquet"), recursive=True))
    parquet = [p for p in parquet if f"{os.sep}socratic{os.sep}" not in p]  # the "main" configuration only
    if parquet:
        return [r for p in parquet for r in pq.read_table(p, columns=["question", "answer"]).to_pylist()]
    jsonl = os.path.join(root, f"{split}.jsonl")
    if os.path.isfile(jsonl):
        with open(jsonl) as f:
            return [json.loads(line) for line in f if line.strip()]
    raise FileNotFoundError(f"no GSM8K {split} split under {root} (looked for **/{split}-*.parquet and {split}.jsonl); "
                            f"download it first: hf download openai/gsm8k --repo-type dataset --local-dir {raw_dir}")


def prepare(raw_dir: str, out_dir: str) -> dict[str, int]:
    """Writes out_dir/train.parquet and out_dir/test.parquet; returns the rows per split."""
    return write_splits(out_dir, lambda split: [to_row(r["question"], r["answer"], split, i) for i, r in enumerate(raw_split(raw_dir, split))])


def main(argv: list[str] | None = None) -> None:
    converter_main(__doc__, "a local copy of openai/gsm8k (parquet) or train/test.jsonl", "~/data/gsm8k", prepare, DATA_SOURCE, argv)


if __name__ == "__main__":
    main()
