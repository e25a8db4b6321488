"""plots.png: the series chosen from a metrics.jsonl match hand-computed values, and the PNG read back has the
promised size and is not blank; SFT-only, step-less and truncated files are handled."""

import json
import sys
import warnings

import pytest

from rlcore.telemetry.plots import line_panels, main, phase_series, read_metrics, reward_series, series, write_plots

NUM_STEPS = 20


class JsonlWriter:
    """Writes rows the way rlcore.telemetry.tracking.Tracker does: {"step": N, **metrics}, and val_generations rows."""

    def __init__(self, run_dir):
        self.file = open(run_dir / "metrics.jsonl", "a")

    def log(self, metrics, step):
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")

    def log_generations(self, samples, step):
        self.file.write(json.dumps({"step": step, "val_generations": [list(s) for s in samples]}) + "\n")

    def close(self):
        self.file.close()


def write_ppo_run(run_dir) -> None:
    """20 steps: reward step/20, two val sources, phases in exact binary fractions so "other" compares exactly."""
    tracker = JsonlWriter(run_dir)
    tracker.log({"val-core/gsm8k/reward/mean@4": 0.125}, step=0)  # val_before_train: not a training step
    for step in range(1, NUM_STEPS + 1):
        metrics = {
            "critic/score/mean": step / 20, "response_length/mean": 10.0 + step, "response_length/max": 20.0 + step,
            "actor/kl_loss": 0.01 * step, "actor/entropy": 1.0 - 0.02 * step,
            "timing_s/gen": 1.0, "timing_s/reward": 0.25, "timing_s/update_actor": 0.5, "timing_s/step": 2.0,
            # Nested inside gen / update_actor: must not be stacked a second time.
            "timing_s/generate_on_rank": 0.875, "timing_s/update_weights": 0.0625, "timing_s/update_actor_on_rank": 0.375,
        }
        if step == 1:
            metrics["timing_s/old_log_prob"] = 0.5  # 2.25 s of phases in a 2.0 s step: "other" floors at 0
        if step % 10 == 0:
            metrics.update({"timing_s/testing": 0.75, "val-core/gsm8k/reward/mean@4": 0.375 if step == 10 else 0.5})
            tracker.log_generations([("1+1=", "2", 1.0)], step=step)
        if step == NUM_STEPS:
            metrics["val-core/math/reward/mean@1"] = 0.25
        tracker.log(metrics, step=step)
    tracker.close()


def test_series_are_the_hand_computed_ones(tmp_path):
    write_ppo_run(tmp_path)
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert len(rows) == NUM_STEPS + 1  # the val_generations rows are skipped
    steps = list(range(1, NUM_STEPS + 1))
    assert reward_series(rows) == {
        "train": (steps, [s / 20 for s in steps]),
        "val gsm8k mean@4": ([0, 10, 20], [0.125, 0.375, 0.5]),
        "val math mean@1": ([20], [0.25]),
    }
    phase_steps, phases = phase_series(rows)
    assert phase_steps == steps
    # Run order inside the step, then "other", then testing (timed after timing_s/step closed); nested ones dropped.
    assert list(phases) == ["gen", "reward", "old_log_prob", "update_actor", "other", "testing"]
    assert phases["gen"] == [1.0] * 20 and phases["update_actor"] == [0.5] * 20
    assert phases["old_log_prob"] == [0.5] + [0.0] * 19
    assert phases["other"] == [0.0] + [0.25] * 19  # 2.0 - (1.0 + 0.25 + 0.5), and 2.0 - 2.25 floored at 0
    assert phases["testing"] == [0.75 if s % 10 == 0 else 0.0 for s in steps]
    titles = [(title, list(lines)) for title, _, lines in line_panels(rows)]
    assert titles == [("reward per step", ["train", "val gsm8k mean@4", "val math mean@1"]),
                      ("response length", ["mean", "max"]), ("KL / entropy", ["kl_loss", "entropy"])]


def test_a_redone_step_keeps_its_last_value():
    # A resumed run redoes the steps after its last checkpoint and appends them to the same file.
    rows = [{"step": 1, "critic/score/mean": 0.5}, {"step": 2, "critic/score/mean": 0.25},
            {"step": 2, "critic/score/mean": 0.75}, {"step": 3, "critic/score/mean": True}]
    assert series(rows, "critic/score/mean") == ([1, 2], [0.5, 0.75])


def test_png_read_back(tmp_path):
    from matplotlib.image import imread

    write_ppo_run(tmp_path)
    path = write_plots(str(tmp_path))
    assert path == str(tmp_path / "plots.png")
    pixels = imread(path)
    assert pixels.shape[:2] == (800, 1200)  # 12 x 8 in at 100 dpi
    rgb = pixels[:, :, :3]
    distinct = {tuple(p) for p in (rgb[::4, ::4] * 255).round().astype(int).reshape(-1, 3)}
    # Empty axes alone give ~100 shades of grey (antialiased text) and no saturated pixel; the drawn run gives ~575
    # colours and ~7% saturated pixels (lines, bars).
    assert len(distinct) > 300, f"only {len(distinct)} colours: a blank figure?"
    saturated = float(((rgb.max(-1) - rgb.min(-1)) > 0.25).mean())
    assert saturated > 0.02, f"{saturated:.1%} coloured pixels: nothing drawn?"


def test_sft_only_keys_give_a_loss_and_validation_png(tmp_path):
    tracker = JsonlWriter(tmp_path)
    for step in range(1, 31):
        metrics = {"train/loss": 3.0 / step, "train/lr": 1e-5, "timing_s/update_on_rank": 0.1}
        if step % 10 == 0:
            metrics.update({"val/loss": 2.0 / step, "val/token_accuracy": step / 40, "val/exact_match": step / 60,
                            "val/rows": 8})
        tracker.log(metrics, step=step)
    tracker.close()
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert phase_series(rows) == ([], {})  # no timing_s/step: no time panel
    assert [(title, list(lines)) for title, _, lines in line_panels(rows)] == [
        ("loss", ["train", "val"]), ("validation", ["val exact_match", "val token_accuracy"])]
    out = tmp_path / "elsewhere.png"
    assert write_plots(str(tmp_path), str(out)) == str(out)
    from matplotlib.image import imread

    assert imread(str(out)).shape[:2] == (800, 1200)


def test_no_training_step_draws_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val-core/gsm8k/reward/mean@1": 0.5}) + "\n")
    assert write_plots(str(tmp_path)) is None
    assert not (tmp_path / "plots.png").exists()
    (tmp_path / "metrics.jsonl").write_text("")
    assert write_plots(str(tmp_path)) is None


def test_truncated_last_line_is_tolerated(tmp_path):
    write_ppo_run(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "critic/score/mean": 0.9, "timing_s/ge')  # killed mid-write
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the expected truncation is silent
        rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert rows[-1]["step"] == NUM_STEPS
    # Resumed: the next row lands on the truncated line, which is then skipped with a warning naming the line.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 21, "critic/score/mean": 0.875}) + "\n")
        f.write(json.dumps({"step": 22, "critic/score/mean": 0.9375}) + "\n")
    with pytest.warns(UserWarning, match="metrics.jsonl:24: skipping"):
        rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert series(rows, "critic/score/mean")[0][-2:] == [20, 22]
    with pytest.warns(UserWarning):
        assert write_plots(str(tmp_path)) is not None


def test_cli_and_missing_matplotlib(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert main([str(tmp_path / "empty")]) == 1
    assert "no training step" in capsys.readouterr().err
    write_ppo_run(tmp_path)
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "plots.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'rlcore\[plots\]'"):
        write_plots(str(tmp_path))
