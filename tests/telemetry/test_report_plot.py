"""report.png: the figure draws the Summary's own numbers (a hand-made one), and a run directory gets its PNG."""

import json

import pytest

from rlcore.telemetry.report import Summary
from rlcore.telemetry.report_plot import draw_report, write_report_plot

pytest.importorskip("matplotlib")

SUMMARY = Summary(steps=[2, 3], wall_s=1.5, shares={"gen": 0.5, "update actor": 0.3, "other": 0.2},
                  seconds={"gen": 0.75, "update actor": 0.45, "other": 0.3}, flops={"update actor": 1e9},
                  ranks=[{"busy": 0.6, "late": 0.1, "wait": 0.1, "idle": 0.2}, {"busy": 0.5, "late": 0.1, "wait": 0.2, "idle": 0.2}])


def test_the_bars_are_the_summarys_shares_in_the_steps_order():
    fig = draw_report(SUMMARY, peak_flops=4e9, title="t")
    phases, ranks = fig.axes
    assert [t.get_text() for t in phases.get_yticklabels()] == ["gen", "update actor", "other"]
    assert [p.get_width() for p in phases.patches] == pytest.approx([0.5, 0.3, 0.2])
    labels = [t.get_text() for t in phases.texts]
    assert labels[1] == " 30.0%  (0.450 s)  MFU 25%" and "MFU" not in labels[0]  # FLOPs only where counted
    # Per rank: busy, late, waiting, idle side by side, each bar filling the wall time.
    widths = [p.get_width() for p in ranks.patches]
    assert widths == pytest.approx([0.6, 0.5, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2])
    assert [t.get_text() for t in ranks.get_legend().get_texts()][2] == "waiting for the slowest rank"


def test_a_run_directory_gets_report_png_and_an_sft_run_none(tmp_path):
    row = {"step": 2, "timing_s/step": 1.0, "timing_s/gen": 0.6, "timing_s/update_actor": 0.3}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    path = write_report_plot(str(tmp_path))
    assert path == str(tmp_path / "report.png") and (tmp_path / "report.png").stat().st_size > 10_000
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    assert write_report_plot(str(sft)) is None and not (sft / "report.png").exists()
