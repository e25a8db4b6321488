"""plots.png: a run's metrics.jsonl as a grid of panels, each drawn only when its metrics exist: PPO/GRPO reward,
response length, KL/entropy, seconds per phase; SFT/RM loss, validation, margin. `python -m rlcore.telemetry.plots RUN_DIR`."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

Series = tuple[list[int], list[float]]  # (steps, values), steps ascending

# Phases PPOTrainer times inside timing_s/step, in the order a step runs them (unknown phases follow, sorted).
STEP_PHASES = ("weight_sync", "gen_max", "gen", "reward_model", "reward", "old_log_prob", "teacher", "ref", "values", "adv",
               "update_critic", "update_actor")
# Timed after timing_s/step has closed (fit() wraps them, not train_step()), so they stack on top of the step.
AFTER_STEP_PHASES = ("testing", "save_checkpoint")
# Worker-side sub-timings nested inside a controller phase (update_weights and generate_on_rank inside gen,
# update_actor_on_rank inside update_actor): stacking them too would count the same seconds twice.
NESTED_SUFFIX, NESTED_PHASES = "_on_rank", ("update_weights",)
KL_KEYS = ("actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty")
VAL_PREFIXES = ("val-core/", "val-aux/", "val/")
NOT_PLOTTED_VAL = ("val/loss", "val/rows", "val/margin")  # drawn in their own panels, or a count, not a score


def read_metrics(path: str) -> list[dict]:
    """The metric rows of a metrics.jsonl in file order, without val_generations rows. An undecodable line is
    skipped: a killed run leaves a truncated last line, and a resumed run appends its first row onto that line."""
    with open(path) as f:
        lines = f.read().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i < len(lines) - 1:  # only the last line is expected to be cut short
                warnings.warn(f"{path}:{i + 1}: skipping an undecodable line (a killed run, resumed?)")
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and "val_generations" not in row:
            rows.append(row)
    return rows


def series(rows: list[dict], key: str) -> Series:
    """One metric per step. A step logged twice keeps its last value: a resumed run redoes the steps after its
    last checkpoint, and the redone ones are the run's history."""
    by_step = {row["step"]: float(row[key]) for row in rows
               if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def training_steps(rows: list[dict]) -> list[int]:
    """Steps that logged a training metric; validation-only rows (step 0 before training) do not count."""
    return sorted({row["step"] for row in rows if any(k != "step" and not k.startswith(VAL_PREFIXES) for k in row)})


def smooth(values: list[float], window: int) -> list[float]:
    """Mean over a centred window of `window` values (fewer at the ends): centred, so a fast early drop (SFT loss)
    is not drawn late the way a trailing mean would draw it."""
    half = window // 2
    chunks = [values[max(i - half, 0):i + half + 1] for i in range(len(values))]
    return [sum(chunk) / len(chunk) for chunk in chunks]


def reward_series(rows: list[dict]) -> dict[str, Series]:
    """Training reward ("train") and each val-core score, labelled by data source ("val tiny_add mean@1")."""
    out = {"train": series(rows, "critic/score/mean")}
    for key in sorted({k for row in rows for k in row if k.startswith("val-core/")}):
        out["val " + key[len("val-core/"):].replace("/reward/", " ")] = series(rows, key)
    return out


def phase_series(rows: list[dict]) -> tuple[list[int], dict[str, list[float]]]:
    """Seconds per phase at each step that has timing_s/step, in stacking order: the phases inside the step, then
    "other" (step minus those phases, floored at 0: dispatch, batch balancing, metrics), then the phases timed after
    the step. A phase a step did not run counts 0 there."""
    steps, totals = series(rows, "timing_s/step")
    if not steps:
        return [], {}
    names = {k[len("timing_s/"):] for row in rows for k in row if k.startswith("timing_s/") and not k.endswith(NESTED_SUFFIX)}
    names -= {"step", *NESTED_PHASES}
    inside = [p for p in STEP_PHASES if p in names] + sorted(names - set(STEP_PHASES) - set(AFTER_STEP_PHASES))
    after = [p for p in AFTER_STEP_PHASES if p in names]
    logged = {name: dict(zip(*series(rows, f"timing_s/{name}"))) for name in inside + after}
    per_step = {name: [logged[name].get(s, 0.0) for s in steps] for name in inside + after}
    other = [max(total - sum(per_step[name][i] for name in inside), 0.0) for i, total in enumerate(totals)]
    return steps, {**{n: per_step[n] for n in inside}, "other": other, **{n: per_step[n] for n in after}}


def line_panels(rows: list[dict]) -> list[tuple[str, str, dict[str, Series]]]:
    """(title, y label, {label: series}) of each line panel whose metrics exist, in grid order; empty series dropped."""
    val_keys = sorted({k for row in rows for k in row if k.startswith("val/")} - set(NOT_PLOTTED_VAL))
    candidates = [
        ("reward per step", "score", reward_series(rows)),
        ("response length", "tokens", {"mean": series(rows, "response_length/mean"),
                                       "max": series(rows, "response_length/max")}),
        ("KL / entropy", "KL", {k.split("/")[1]: series(rows, k) for k in KL_KEYS + ("actor/entropy",)}),
        ("loss", "loss", {"train": series(rows, "train/loss"), "val": series(rows, "val/loss")}),
        ("validation", "score", {"train accuracy": series(rows, "train/accuracy"),
                                 **{"val " + k[len("val/"):]: series(rows, k) for k in val_keys}}),
        ("margin", "chosen - rejected", {"train": series(rows, "train/margin"), "val": series(rows, "val/margin")}),
        ("tool use (multi-turn)", "per trajectory / share", {"calls per trajectory": series(rows, "tool/calls_per_trajectory"),
                                                             "turns": series(rows, "num_turns/mean"),
                                                             "tool error rate": series(rows, "tool/error_rate")}),
    ]
    panels = [(title, ylabel, {label: s for label, s in lines.items() if s[0]}) for title, ylabel, lines in candidates]
    return [panel for panel in panels if panel[2]]


def _draw_lines(ax, title: str, ylabel: str, lines: dict[str, Series]) -> None:
    drawn_on = [ax]
    for i, (label, (steps, values)) in enumerate(lines.items()):
        target = ax
        if label == "entropy" and len(lines) > 1:  # another scale than KL: its own y axis on the right
            drawn_on.append(target := ax.twinx())
            target.set_ylabel("entropy")
        if label.startswith("val"):  # sparse (every test_freq steps): markers show where the points are
            target.plot(steps, values, "o-", color=f"C{i}", markersize=4, label=label)
        elif len(steps) >= 50 and label != "max":  # noisy per step: a running mean over it (not over maxima: extremes)
            window = max(len(values) // 25, 5) | 1  # odd: centred on the step
            target.plot(steps, values, color=f"C{i}", alpha=0.3, linewidth=0.8)
            target.plot(steps, smooth(values, window), color=f"C{i}", linewidth=1.6, label=f"{label} ({window}-step avg)")
        else:
            target.plot(steps, values, color=f"C{i}", alpha=0.45 if label == "max" else 1.0, label=label,
                        marker="." if len(steps) < 30 else None)
    ax.set_ylabel(ylabel)
    low, high = ax.get_ylim()
    if high - low < 1e-6 * max(abs(low), abs(high)):  # equal but for float noise (accuracy 1 vs 0.99999998)
        ax.set_ylim(low - 0.05 * abs(low), high + 0.05 * abs(high))
    # Above the axes, under the panel's title: inside, "best" cannot see a twin axis's lines and covered entropy.
    handles = [h for a in drawn_on for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, title=title, title_fontsize=11, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=min(len(handles), 3), frameon=False)


def _draw_time_stack(ax, steps: list[int], phases: dict[str, list[float]], colormaps) -> None:
    colors = ["0.75" if name == "other" else colormaps["tab20"](i % 20) for i, name in enumerate(phases)]
    if len(steps) <= 40:  # a few steps: bars read better than an area that is mostly slopes
        bottom = [0.0] * len(steps)
        for (name, values), color in zip(phases.items(), colors):
            ax.bar(steps, values, bottom=bottom, color=color, label=name, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values)]
    else:
        ax.stackplot(steps, *phases.values(), labels=list(phases), colors=colors, linewidth=0)
    ax.set(title="time per step, by phase", ylabel="seconds")
    # Outside, right of the axes (a dozen phases inside would hide the stack), top-down in the stack's order.
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def write_plots(run_dir: str, out_path: str | None = None) -> str | None:
    """Draws {run_dir}/metrics.jsonl into one PNG (default {run_dir}/plots.png, 1200x800 px) and returns its path;
    None, with nothing written, when the file has no training step."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    steps = training_steps(rows)
    if not steps:
        return None
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"plots.png needs matplotlib: pip install 'rlcore[plots]' ({e})") from e
    panels, (time_steps, phases) = line_panels(rows), phase_series(rows)
    num_panels = len(panels) + bool(time_steps)
    num_cols = 1 if num_panels == 1 else 2 if num_panels <= 4 else 3
    # A Figure on an Agg canvas, not pyplot: no display needed, and no global figure state left behind.
    fig = Figure(figsize=(12, 8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(math.ceil(num_panels / num_cols), num_cols, i + 1) for i in range(num_panels)]
    for ax, (title, ylabel, lines) in zip(axes, panels):
        _draw_lines(ax, title, ylabel, lines)
    if time_steps:
        _draw_time_stack(axes[len(panels)], time_steps, phases, matplotlib.colormaps)
    first, last = min(row["step"] for row in rows), max(row["step"] for row in rows)
    pad = max((last - first) * 0.02, 0.6)  # bars are 0.8 wide
    for ax in axes:
        # One step range on every panel, so that a panel with a few late points (a final validation) lines up.
        ax.set(xlabel="step", xlim=(first - pad, last + pad))
        ax.xaxis.get_major_locator().set_params(integer=True)  # no step 2.5 on short runs
        ax.grid(alpha=0.3)
    fig.suptitle(f"{os.path.basename(os.path.abspath(run_dir))}: {steps[-1]} steps")
    out_path = out_path or os.path.join(run_dir, "plots.png")
    fig.savefig(out_path, dpi=100)
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw RUN_DIR/metrics.jsonl into a PNG and print its path.")
    parser.add_argument("run_dir")
    parser.add_argument("--out", help="PNG path (default: RUN_DIR/plots.png)")
    args = parser.parse_args(argv)
    path = write_plots(args.run_dir, args.out)
    print(path or f"{args.run_dir}/metrics.jsonl has no training step: nothing drawn", file=sys.stdout if path else sys.stderr)
    return 0 if path else 1


if __name__ == "__main__":
    sys.exit(main())
