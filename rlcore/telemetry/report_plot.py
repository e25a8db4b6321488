"""report.png: the utilisation report drawn, for the reader who would rather look than read a table.

Two panels from the same Summary the text report prints (rlcore.telemetry.report): the step's wall time split by
phase, each bar labelled with its share and, where the phase does model FLOPs, its MFU; and each rank's wall time
split into busy / late / waiting / idle. Nothing here computes a figure of its own, so the picture and report.txt
cannot disagree.
"""

from __future__ import annotations

import os

from rlcore.telemetry.report import PHASES, Summary, load_run, summarise

RANK_STATES = (("busy", "busy in a method", "tab:green"), ("late", "call not there yet", "tab:orange"),
               ("wait", "waiting for the slowest rank", "tab:red"), ("idle", "idle (controller)", "0.8"))


def draw_report(summary: Summary, peak_flops: float | None, title: str):
    """The report as a matplotlib Figure on an Agg canvas (no display, no pyplot state). Raises ImportError without
    matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [name for name, _, _ in PHASES if name in summary.shares]
    rows = 2 if summary.ranks else 1
    height = 0.32 * len(names) + (0.35 * len(summary.ranks) + 1.2 if summary.ranks else 0) + 1.3
    fig = Figure(figsize=(10, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, 1, height_ratios=[len(names) + 1, len(summary.ranks) + 2][:rows])
    _draw_phases(fig.add_subplot(grid[0]), summary, names, peak_flops)
    if summary.ranks:
        _draw_ranks(fig.add_subplot(grid[1]), summary.ranks)
    fig.suptitle(title, fontsize=11)
    return fig


def _draw_phases(ax, summary: Summary, names: list[str], peak_flops: float | None) -> None:
    shares = [summary.shares[name] for name in names]
    colors = ["0.7" if name in ("dispatch/transfer", "other") else "tab:blue" for name in names]
    ax.barh(names, shares, color=colors)
    ax.invert_yaxis()  # the step's order, top-down
    for y, name in enumerate(names):
        label = f" {summary.shares[name]:.1%}  ({summary.seconds[name]:.3f} s)"
        achieved = summary.flops.get(name)
        if achieved and peak_flops:
            label += f"  MFU {achieved / peak_flops:.0%}"
        ax.text(summary.shares[name], y, label, va="center", fontsize=8)
    ax.set(xlim=(0, min(1.0, max(shares) * 1.6)), xlabel="share of the step's wall time",
           title=f"where a step's {summary.wall_s:.3f} s went (steps {summary.steps[0]}-{summary.steps[-1]})")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    ax.grid(axis="x", alpha=0.3)


def _draw_ranks(ax, ranks: list[dict[str, float]]) -> None:
    labels = [f"rank {r}" for r in range(len(ranks))]
    left = [0.0] * len(ranks)
    for key, meaning, color in RANK_STATES:
        widths = [share[key] for share in ranks]
        ax.barh(labels, widths, left=left, color=color, label=meaning)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set(xlim=(0, 1), xlabel="share of the wall time", title="per rank")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)


def write_report_plot(run_dir: str, out_path: str | None = None) -> str | None:
    """Draws the run's report into {run_dir}/report.png (or out_path) and returns the path; None, with nothing
    written, for a run without PPO step timings (an SFT or reward-model run)."""
    rows, ranks, facts = load_run(run_dir)
    summary = summarise(rows, ranks)
    if summary is None:
        return None
    fig = draw_report(summary, facts.get("peak_flops"), f"{os.path.basename(os.path.abspath(run_dir))}: utilisation report")
    out_path = out_path or os.path.join(run_dir, "report.png")
    fig.savefig(out_path, dpi=100)
    return out_path
