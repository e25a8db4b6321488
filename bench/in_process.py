"""The benchmarks' training runs: rlcore-train's own code, called in this process.

`train(overrides, run_dir)` composes the overrides as `rlcore-train key=value ...` composes its command line and
runs them with rlcore.train.run, so a benchmark times the trainer users run. In this process rather than a fresh one
per run: rlcore's imports are paid once, and a Ray cluster that is already running (RAY_ADDRESS, or the one
tests/test_bench.py's pytest session keeps) is joined instead of started and stopped for every run. What a run
prints goes to run_dir/train.log, so that the benchmark's own table stays readable.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo_assets() -> str:
    """The tiny demo's assets where `make train` keeps them (.cache/tiny_cpu), built first if missing or stale."""
    from rlcore.cli.prepare_tiny import prepare

    out = os.path.join(ROOT, ".cache", "tiny_cpu")
    with open(os.devnull, "w") as quiet, redirect_stdout(quiet):
        prepare(out)
    return out


def demo_overrides(assets: str) -> list[str]:
    """recipe=tiny_cpu on `assets` (absolute paths: the recipe's own are relative to the repository root)."""
    return ["recipe=tiny_cpu", f"actor_rollout_ref.model.path={assets}/sft_model", f"data.train_files={assets}/data/train.parquet",
            f"data.val_files={assets}/data/test.parquet"]


def train(overrides: list[str], run_dir: str, config_name: str = "ppo_trainer") -> list[dict]:
    """Trains with `overrides` (rlcore-train's key=value form) into `run_dir`; the rows of its metrics.jsonl. A run
    that fails ends the benchmark with the end of its log."""
    from rlcore.config import compose
    from rlcore.train import run

    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "train.log")
    try:
        with open(log, "w") as f, redirect_stdout(f), redirect_stderr(f):
            run(compose(overrides, config_name), run_dir)
    except (Exception, SystemExit) as err:  # SystemExit: rlcore.train ends a hung or crashed run with one
        with open(log) as f:
            tail = f.read()[-3000:]
        sys.exit(f"{' '.join(overrides)} failed ({type(err).__name__}: {err}):\n{tail}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
