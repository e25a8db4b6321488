"""What the converters from a public dataset's local copy to verl's rows share (rlcore.data.gsm8k, rlcore.data.geo3k):
writing the train and test splits, and their command line."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from rlcore.data.synthetic import write_parquet


def write_splits(out_dir: str, rows_of: Callable[[str], list[dict[str, Any]]]) -> dict[str, int]:
    """Writes out_dir/train.parquet and out_dir/test.parquet from `rows_of(split)`; returns the rows per split."""
    counts = {}
    for split in ("train", "test"):
        rows = rows_of(split)
        write_parquet(rows, os.path.join(os.path.expanduser(out_dir), f"{split}.parquet"))
        counts[split] = len(rows)
    return counts


def converter_main(doc: str, raw_help: str, default_out: str, prepare: Callable[[str, str], dict[str, int]], data_source: str,
                   argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw_dir", required=True, help=raw_help)
    parser.add_argument("--out_dir", default=default_out)
    args = parser.parse_args(argv)
    counts = prepare(args.raw_dir, args.out_dir)
    print(f"wrote {counts['train']} train and {counts['test']} test rows to {os.path.expanduser(args.out_dir)} "
          f"(data_source {data_source}, verl's row format)")
