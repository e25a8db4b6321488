"""The end of a run's telemetry: the utilisation report printed and kept, the metrics and the report drawn."""

from __future__ import annotations

import os

from rlcore.telemetry.plots import write_plots
from rlcore.telemetry.report import format_report
from rlcore.telemetry.report_plot import write_report_plot


def finish_run(run_dir: str) -> None:
    """The end of a run: the report printed and kept as report.txt, the metrics drawn into plots.png and the report
    into report.png (without matplotlib, a note instead: the run itself succeeded)."""
    report = format_report(run_dir)
    if report:
        print(report, flush=True)
        with open(os.path.join(run_dir, "report.txt"), "w") as f:
            f.write(report + "\n")
    try:
        paths = [path for path in (write_plots(run_dir), write_report_plot(run_dir)) if path]
    except ImportError as err:
        print(f"rlcore: no plots.png: {err}", flush=True)
        return
    if paths:
        print(f"plots: {', '.join(paths)}", flush=True)
