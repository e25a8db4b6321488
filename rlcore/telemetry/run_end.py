"""The end of a run's telemetry: the utilisation report printed and kept, the metrics and the report drawn, and the
held-out scores a run (or a sweep of runs) is compared by."""

from __future__ import annotations

import json
import math
import os
import re

from rlcore.telemetry.plots import write_plots
from rlcore.telemetry.report import format_report
from rlcore.telemetry.report_plot import write_report_plot

# verl's validation metric of one data source's rule or model score: val-core/<data_source>/reward/mean@<n>
VAL_SCORE = re.compile(r"^val-core/.+/reward/mean@\d+$")


def val_scores(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, held-out score) of every validation in a run's metrics rows: the mean over data sources of
    val-core/<source>/reward/mean@n, the figure `val accuracy before/after RL` prints."""
    scores = []
    for row in rows:
        values = [v for k, v in row.items() if VAL_SCORE.match(k)]
        if values:
            scores.append((int(row.get("step", 0)), sum(values) / len(values)))
    return scores


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_summary(run_dir: str) -> dict[str, float]:
    """What a sweep compares a run by: the held-out score at the last and the best validation (nan without one),
    the last step's training reward and steps/s."""
    rows = read_metrics(run_dir)
    scores = val_scores(rows)
    steps = [r for r in rows if "timing_s/step" in r]
    last = steps[-1] if steps else {}
    best_step, best = max(scores, key=lambda s: s[1]) if scores else (-1, math.nan)
    return {"val_last": scores[-1][1] if scores else math.nan, "val_best": best, "val_best_step": best_step,
            "final_reward": last.get("critic/score/mean", math.nan),
            "steps_per_s": 1.0 / last["timing_s/step"] if last.get("timing_s/step") else math.nan}


def short_line(run_dir: str) -> str:
    """trainer.verbosity=short: the whole run in one line."""
    s = run_summary(run_dir)
    val = "no validation" if math.isnan(s["val_last"]) else (
        f"held-out {s['val_last']:.4f} (best {s['val_best']:.4f} at step {s['val_best_step']})")
    return f"rlcore: {run_dir}: {val}, reward {s['final_reward']:.4f}, {s['steps_per_s']:.2f} steps/s (report.txt there)"


def finish_run(run_dir: str, verbosity: str = "full") -> None:
    """The end of a run: the report printed (with verbosity=full; one line with short) and kept as report.txt, the
    metrics drawn into plots.png and the report into report.png (without matplotlib, a note instead: the run itself
    succeeded)."""
    report = format_report(run_dir)
    if report:
        if verbosity == "full":
            print(report, flush=True)
        with open(os.path.join(run_dir, "report.txt"), "w") as f:
            f.write(report + "\n")
    try:
        paths = [path for path in (write_plots(run_dir), write_report_plot(run_dir)) if path]
    except ImportError as err:
        paths = []
        print(f"rlcore: no plots.png: {err}", flush=True)
    if paths and verbosity == "full":
        print(f"plots: {', '.join(paths)}", flush=True)
    if verbosity == "short":
        print(short_line(run_dir), flush=True)
