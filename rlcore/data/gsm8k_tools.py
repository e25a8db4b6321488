"""GSM8K rows for multi-turn training with the calculator tool (recipes/qwen2_5_3b_gsm8k_tools.yaml).

Takes verl's GSM8K parquet (rlcore.data.gsm8k, or verl's examples/data_preprocess/gsm8k.py: a user turn ending "Let's think step by step and
output the final answer after "####".", `reward_model.ground_truth`) and puts a system turn first that offers the
calculator, as verl's gsm8k_multiturn_w_tool preprocessing does for its tool. The tool's schema itself is not written
here: the chat template renders it from the tool config (RLHFDataset's `tools`). Ground truths and data_source stay,
so the GSM8K rule scorer scores the final `#### <answer>` of the whole trajectory.

    python -m rlcore.data.gsm8k_tools --in_dir ~/data/gsm8k --out_dir ~/data/gsm8k_tools
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rlcore.data.dataset import read_rows
from rlcore.data.synthetic import write_parquet

SYSTEM_PROMPT = ("You are a math expert. Solve the problem step by step. For any arithmetic, call the `calculator` tool "
                 "instead of computing in your head, and use its result. Put your final answer after \"####\".")


def with_calculator(row: dict[str, Any]) -> dict[str, Any]:
    """The row with the system turn first (replacing one already there). The calculator needs no per-row arguments,
    so no `extra_info.tools_kwargs` (parquet cannot store an empty struct; a missing one means none)."""
    prompt = [m for m in row["prompt"] if m["role"] != "system"]
    return {**row, "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *prompt]}


def convert(in_dir: str, out_dir: str) -> list[str]:
    """train.parquet and test.parquet of `in_dir` -> the same files in `out_dir`; returns the written paths."""
    written = []
    for split in ("train", "test"):
        src = os.path.join(os.path.expanduser(in_dir), f"{split}.parquet")
        if not os.path.isfile(src):
            raise FileNotFoundError(f"{src} not found: write verl's GSM8K parquet first (python -m rlcore.data.gsm8k --raw_dir "
                                    f"<a copy of openai/gsm8k> --out_dir {in_dir}, or verl's examples/data_preprocess/gsm8k.py)")
        rows, _ = read_rows([src])
        written.append(write_parquet([with_calculator(r) for r in rows], os.path.join(os.path.expanduser(out_dir), f"{split}.parquet")))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in_dir", default="~/data/gsm8k")
    parser.add_argument("--out_dir", default="~/data/gsm8k_tools")
    args = parser.parse_args(argv)
    for path in convert(args.in_dir, args.out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
