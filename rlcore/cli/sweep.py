"""Hydra multirun summary (`rlcore-train -m ...`): one row per job, printed when the sweep ends.

Each job writes `summary.json` (held-out score last and best, training reward, steps/s, wall seconds) into its own
output directory; this callback, registered under `hydra.callbacks` in config/ppo_trainer.yaml, reads them back as
jobs finish and prints the table at the end (with `trainer.verbosity=short` each job prints one line, not its
report). Jobs that failed are listed with their error instead of numbers. It works with any sweeper (basic, Optuna)
and with launchers that run jobs elsewhere, since it only reads the job directories. Jobs run in the sweep's own
process share one local Ray cluster and its warm worker processes (rlcore.controller.ray_session).
"""

from __future__ import annotations

import json
import os
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rlcore.telemetry.run_end import run_summary

SUMMARY_FILE = "summary.json"


def write_job_summary(output_dir: str, steps: int, wall_s: float) -> dict[str, float]:
    """What a sweep compares: the held-out score at the last and the best validation, the last step's training
    reward and speed (rlcore.telemetry.run_end.run_summary), and the job's wall time."""
    summary = {**run_summary(output_dir), "steps": steps, "wall_s": wall_s}
    with open(os.path.join(output_dir, SUMMARY_FILE), "w") as f:
        json.dump(summary, f)
    return summary


COLUMNS = (("val last", "val_last", "{:.4f}"), ("val best", "val_best", "{:.4f}"), ("train reward", "final_reward", "{:.4f}"),
           ("steps/s", "steps_per_s", "{:.2f}"), ("wall s", "wall_s", "{:.0f}"))


def format_summary(rows: list[tuple[str, dict[str, Any] | None, str]]) -> str:
    """rows: (job overrides, summary or None, status or error)."""
    # The overrides every job shares go on one line above the table: the column shows what the sweep varied.
    common = set.intersection(*(set(o.split()) for o, _, _ in rows)) if len(rows) > 1 else set()
    shared = [t for t in rows[0][0].split() if t in common] if rows else []
    rows = [(" ".join(t for t in o.split() if t not in common), summary, status) for o, summary, status in rows]
    header = ("#", "overrides", *(name for name, _, _ in COLUMNS))
    table = [header]
    for i, (overrides, summary, status) in enumerate(rows):
        if summary is None:
            table.append((str(i), overrides, status, *[""] * (len(COLUMNS) - 1)))
        else:
            table.append((str(i), overrides, *(fmt.format(summary.get(key, float("nan"))) for _, key, fmt in COLUMNS)))
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if c == 1 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths)))
             for row in table]
    # docs/recipes.md says what each column is (the held-out score: the mean over data sources of val-core/*/mean@n).
    return "\n".join([f"rlcore sweep summary ({len(rows)} jobs; val: held-out score, last and best; reward, steps/s: last step)"]
                     + ([f"every job: {' '.join(shared)}"] if shared else []) + lines)


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any] | None, str]] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from rlcore.controller.ray_session import keep_local_cluster

        self.rows = []
        keep_local_cluster()  # the jobs share one Ray cluster and its warm worker processes

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        overrides = " ".join(job_return.overrides or [])
        # the job's output directory (its working_dir is the launch directory unless hydra.job.chdir=True)
        hydra_cfg = job_return.hydra_cfg
        output_dir = (OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") if hydra_cfg is not None else None) \
            or job_return.working_dir
        path = os.path.join(output_dir or "", SUMMARY_FILE)
        if job_return.status == JobStatus.COMPLETED and os.path.isfile(path):
            with open(path) as f:
                self.rows.append((overrides, json.load(f), "ok"))
        else:
            error = job_return._return_value if job_return.status == JobStatus.FAILED else "no summary"
            self.rows.append((overrides, None, f"failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rlcore.controller.ray_session import end_kept_cluster

        end_kept_cluster()
        print(format_summary(self.rows), flush=True)
