"""`rlcore-report RUN_DIR`: a finished (or running) run's utilisation report, and its plots.png and report.png.

`rlcore-report --peaks` lists the nominal dense bf16 peaks that MFU is measured against on CUDA devices.
"""

from __future__ import annotations

import argparse
import sys

from rlcore.telemetry.plots import write_plots
from rlcore.telemetry.report import format_report
from rlcore.telemetry.report_plot import write_report_plot
from rlcore.utils.device import NOMINAL_BF16_TFLOPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlcore-report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", help="a run directory (the one holding metrics.jsonl)")
    parser.add_argument("--peaks", action="store_true", help="print the nominal bf16 peak table and exit")
    parser.add_argument("--no-plots", action="store_true", help="do not (re)draw RUN_DIR/plots.png and report.png")
    args = parser.parse_args(argv)
    if args.peaks:
        for name, tflops in sorted(NOMINAL_BF16_TFLOPS.items(), key=lambda item: -item[1]):
            print(f"{name:<12}{tflops:>8.1f} TFLOP/s")
        return 0
    if not args.run_dir:
        parser.error("RUN_DIR is required (or --peaks)")
    try:
        report = format_report(args.run_dir)
    except FileNotFoundError as err:
        print(f"rlcore-report: {args.run_dir} is not a run directory: {err}", file=sys.stderr)
        return 2
    plots = None if args.no_plots else write_plots(args.run_dir)
    drawn = None if args.no_plots or report is None else write_report_plot(args.run_dir)
    if report is None and plots is None:
        print(f"rlcore-report: {args.run_dir}/metrics.jsonl has no training step yet", file=sys.stderr)
        return 1
    print(report or f"{args.run_dir}: no PPO step timings (an rlcore-sft or rlcore-rm run has no phases to report)")
    if plots:
        print(f"plots: {', '.join(p for p in (plots, drawn) if p)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
