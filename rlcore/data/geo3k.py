"""Geometry3K in verl's row format, the files verl's Qwen2.5-VL GRPO scripts read (`data.train_files=~/data/geo3k/train.parquet`).

The same rows as verl's examples/data_preprocess/geo3k.py: the problem (its `<image>` placeholder where the diagram
goes) with verl's instruction appended as one user turn, the diagram in `images` (`{"bytes": ...}` as the dataset
stores it), the answer as the rule scorer's ground truth, data_source `hiyouga/geometry3k` (rlcore's geo3k scorer,
rlcore/reward/scorers.py). The raw dataset comes from a local copy, so the step that needs the network is one command
you can run anywhere:

    hf download hiyouga/geometry3k --repo-type dataset --local-dir ~/data/geo3k_raw   # data/{train,test}-*.parquet
    python -m rlcore.data.geo3k --raw_dir ~/data/geo3k_raw --out_dir ~/data/geo3k
"""

from __future__ import annotations

import glob
import os
from typing import Any

import pyarrow.parquet as pq

from rlcore.data.converters import converter_main, write_splits

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
               "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}.")


def to_row(problem: str, answer: str, images: list[Any], split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def raw_split(raw_dir: str, split: str) -> list[dict[str, Any]]:
    """The raw {problem, answer, images} records of a split from a local copy of the dataset (parquet)."""
    root = os.path.expanduser(raw_dir)
    files = sorted(glob.glob(os.path.join(root, "**", f"{split}-*.parquet"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no Geometry3K {split} split under {root} (looked for **/{split}-*.parquet); download it "
                                f"first: hf download hiyouga/geometry3k --repo-type dataset --local-dir {raw_dir}")
    return [r for f in files for r in pq.read_table(f, columns=["problem", "answer", "images"]).to_pylist()]


def prepare(raw_dir: str, out_dir: str) -> dict[str, int]:
    """Writes out_dir/train.parquet and out_dir/test.parquet; returns the rows per split."""
    return write_splits(out_dir, lambda split: [to_row(r["problem"], r["answer"], r["images"], split, i) for i, r in enumerate(raw_split(raw_dir, split))])


def main(argv: list[str] | None = None) -> None:
    converter_main(__doc__, "a local copy of hiyouga/geometry3k (data/{train,test}-*.parquet)", "~/data/geo3k", prepare, DATA_SOURCE, argv)


if __name__ == "__main__":
    main()
