"""The synthetic `tiny_add` task: "a+b=" -> "a+b", written as parquet in verl's row format.

Rows look like verl's gsm8k preprocessing output:

    {"data_source": "tiny_add", "prompt": [{"role": "user", "content": "37+45="}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "82"},
     "extra_info": {"split": "train", "index": 0, "answer": "82"}}

Usage: python -m rlcore.data.synthetic --out_dir ~/data/tiny_add [--num_train 4000 --num_test 200 ...]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TASK_NAME = "tiny_add"


def _operand_range(min_digits: int, max_digits: int) -> tuple[int, int]:
    """Inclusive [low, high] of the integers with min_digits..max_digits digits (0 counts as one digit)."""
    if not 1 <= min_digits <= max_digits <= 9:
        # 9 digits keeps the pair index (range size squared) inside int64.
        raise ValueError(
            f"need 1 <= min_digits <= max_digits <= 9, got min_digits={min_digits}, max_digits={max_digits}"
        )
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return low, 10**max_digits - 1


def make_addition_rows(
    num_rows: int,
    min_digits: int,
    max_digits: int,
    seed: int,
    exclude: Collection[tuple[int, int]] = frozenset(),
    split: str = "train",
) -> list[dict[str, Any]]:
    """Returns num_rows distinct problems a+b, never an (a, b) pair in `exclude`.

    Each operand is uniform over the integers with min_digits..max_digits digits, i.e. the pair (a, b) is drawn
    uniformly without replacement from that square (so with 1..2 digits most operands have two digits).
    """
    low, high = _operand_range(min_digits, max_digits)
    width = high - low + 1
    num_pairs = width * width
    excluded = {(a, b) for a, b in exclude if low <= a <= high and low <= b <= high}
    if num_rows < 0 or num_rows > num_pairs - len(excluded):
        raise ValueError(
            f"cannot draw {num_rows} distinct {min_digits}..{max_digits}-digit problems: only "
            f"{num_pairs - len(excluded)} pairs are left after excluding {len(excluded)}; raise max_digits"
        )
    # Drawing num_rows + |excluded| distinct pairs guarantees num_rows survive the exclusion filter.
    rng = np.random.default_rng(seed)
    flat = rng.choice(num_pairs, size=min(num_rows + len(excluded), num_pairs), replace=False)
    pairs = [(low + int(k) // width, low + int(k) % width) for k in flat]
    pairs = [p for p in pairs if p not in excluded][:num_rows]

    return [task_row(TASK_NAME, f"{a}+{b}=", str(a + b), split, index) for index, (a, b) in enumerate(pairs)]


def task_row(data_source: str, question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """One verl-format row: the question as a single user turn, the answer as the rule scorer's ground truth."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer},
    }


def row_operands(row: dict[str, Any]) -> tuple[int, int]:
    """Parses (a, b) back out of a tiny_add row's prompt."""
    a, b = row["prompt"][-1]["content"].rstrip("=").split("+")
    return int(a), int(b)


def write_parquet(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Writes rows (nested dicts / lists allowed) to one parquet file; returns the expanded path.

    pyarrow infers list<struct> / struct columns, so `pq.read_table(path).to_pylist()` gives the rows back.
    """
    if not rows:
        raise ValueError(f"refusing to write an empty parquet file to {path}: no rows")
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def write_task(
    out_dir: str, num_train: int, num_test: int, min_digits: int, max_digits: int, seed: int, interaction: str | None = None
) -> dict[str, str]:
    """Writes train.parquet, test.parquet and sft.parquet under out_dir; returns {"train"|"test"|"sft": path}.

    The test set is drawn first and excluded from train, so no (a, b) pair appears in both. sft.parquet holds
    the train rows plus a `response` column (the answer string; the SFT trainer appends eos itself). `interaction`:
    each row names that interaction in extra_info.interaction_kwargs (verl's gsm8k_multiturn_w_interaction rows).
    """
    out_dir = os.path.expanduser(out_dir)
    test_rows = make_addition_rows(num_test, min_digits, max_digits, seed, split="test")
    test_pairs = {row_operands(row) for row in test_rows}
    # seed + 1 so train is not just a continuation of the test stream.
    train_rows = make_addition_rows(num_train, min_digits, max_digits, seed + 1, exclude=test_pairs, split="train")
    if interaction:
        for row in (*test_rows, *train_rows):
            row["extra_info"]["interaction_kwargs"] = {"name": interaction, "query": row["prompt"][-1]["content"],
                                                       "ground_truth": row["reward_model"]["ground_truth"]}
    sft_rows = [{**row, "response": row["extra_info"]["answer"]} for row in train_rows]
    return {
        "train": write_parquet(train_rows, os.path.join(out_dir, "train.parquet")),
        "test": write_parquet(test_rows, os.path.join(out_dir, "test.parquet")),
        "sft": write_parquet(sft_rows, os.path.join(out_dir, "sft.parquet")),
    }


def preference_pairs(rows: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Reward-model pairs from task rows: the right answer chosen over a wrong one. Half the wrong answers change
    one digit (at a uniformly drawn position, so the model must check every digit, not just the last), a quarter
    are near misses (off by 1..10, the carry mistakes), a quarter any other sum in range."""
    rng = np.random.default_rng(seed)
    pairs = []
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        wrong = answer
        while wrong == answer:
            kind = rng.random()
            if kind < 0.5:
                i = int(rng.integers(len(answer)))
                wrong = (answer[:i] + str(int(rng.integers(10))) + answer[i + 1 :]).lstrip("0") or "0"
            elif kind < 0.75:
                wrong = str(max(0, int(answer) + int(rng.integers(-10, 11))))
            else:
                wrong = str(int(rng.integers(0, 199)))
        pairs.append({"data_source": row["data_source"], "prompt": row["prompt"], "chosen": answer, "rejected": wrong})
    return pairs


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=f"Write the synthetic {TASK_NAME} task as verl-format parquet.")
    parser.add_argument("--out_dir", required=True, help="folder for train/test/sft.parquet (~ is expanded)")
    parser.add_argument("--num_train", type=int, default=4000)
    parser.add_argument("--num_test", type=int, default=200)
    parser.add_argument("--min_digits", type=int, default=1)
    parser.add_argument("--max_digits", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interaction", default=None, help="name an interaction in each row (interactions/tiny_add.yaml: tiny_add)")
    args = parser.parse_args(argv)
    paths = write_task(args.out_dir, args.num_train, args.num_test, args.min_digits, args.max_digits, args.seed, args.interaction)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return paths


if __name__ == "__main__":
    main()
