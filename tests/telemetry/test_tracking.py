"""trainer.logger backends, each read back with its own library: tensorboard's EventAccumulator, the offline wandb
run's .wandb records, mlflow's MlflowClient. No mocks of the libraries."""

from __future__ import annotations

import glob
import json
import os
import struct

import psutil
import pytest

from rlcore.config.schema import TrainerConfig
from rlcore.telemetry import tracking
from rlcore.telemetry.tracking import Tracker, logger_errors

VAL_KEY = "val-core/tiny_add/reward/mean@4"
# step -> metrics, as the PPO trainer logs them: validation before training, then train steps (one with validation)
STEPS = {
    0: {VAL_KEY: 0.25},
    1: {"actor/pg_loss": 0.5, "perf/throughput": 1024.0, "timing_s/step": 1.5},
    2: {"actor/pg_loss": -0.25, "perf/throughput": 2048, "timing_s/step": 1.25, VAL_KEY: 0.75},
}
SAMPLES = [("1+1=", "2", 1.0), ("2+2=|?", "5\nor 4", 0.0)]  # a `|` and a newline: the markdown table must cope
CONFIG = {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}}, "data": {"train_files": ["a.parquet", "b.parquet"]},
          "trainer": {"project_name": "proj", "experiment_name": "exp", "logger": ["console", "mlflow"]}}


def run_tracker(loggers: list[str], run_dir) -> Tracker:
    """Logs STEPS (and SAMPLES at step 2) through a Tracker and closes it."""
    tracker = Tracker(loggers, str(run_dir), len(STEPS), project_name="proj", experiment_name="exp", config=CONFIG)
    try:
        for step, metrics in STEPS.items():
            if step == 2:
                tracker.log_generations(SAMPLES, step)
            tracker.log(metrics, step)
            tracker.advance()
    finally:
        tracker.close()
    return tracker


def jsonl_rows(tracker: Tracker) -> list[dict]:
    return [json.loads(line) for line in open(tracker.jsonl_path)]


def test_jsonl_is_always_written_and_file_is_its_verl_name(tmp_path):
    for i, loggers in enumerate(([], ["file"], ["console", "jsonl", "file"])):
        tracker = run_tracker(loggers, tmp_path / f"run{i}")
        assert jsonl_rows(tracker) == [
            {"step": 0, **STEPS[0]}, {"step": 1, **STEPS[1]},
            {"step": 2, "val_generations": [list(s) for s in SAMPLES]}, {"step": 2, **STEPS[2]},
        ]
        assert len(tracker.backends) == 1 + ("console" in loggers)  # file and jsonl: one backend, one file


def test_logger_errors_name_the_valid_loggers_and_the_missing_package(monkeypatch):
    assert logger_errors(["console", "file", "jsonl", "tensorboard", "wandb", "mlflow"]) == []
    [error] = logger_errors(["console", "swanlab"])
    assert "['swanlab']" in error and "valid: console, file, jsonl, tensorboard, wandb, mlflow" in error
    monkeypatch.setattr(tracking, "_module_available", lambda module: module not in ("wandb", "mlflow"))
    errors = logger_errors(["console", "wandb", "mlflow", "wandb", "tensorboard"])
    assert errors == [
        "trainer.logger has 'wandb' but the wandb package is not installed: pip install 'rlcore[tracking]' (or pip install wandb)",
        "trainer.logger has 'mlflow' but the mlflow package is not installed: pip install 'rlcore[tracking]' (or pip install mlflow-skinny)",
    ]
    with pytest.raises(ValueError, match="pip install wandb"):
        Tracker(["console", "wandb"], "unused", 1)


def test_tensorboard_holds_every_scalar_at_its_step_and_the_samples(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    run_tracker(["console", "tensorboard"], tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "tensorboard_log" / "proj" / "exp"), size_guidance={"tensors": 0}).Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {  # every value is exact in float32, which is what tensorboard stores
        VAL_KEY: [(0, 0.25), (2, 0.75)], "actor/pg_loss": [(1, 0.5), (2, -0.25)],
        "perf/throughput": [(1, 1024.0), (2, 2048.0)], "timing_s/step": [(1, 1.5), (2, 1.25)],
    }
    [text] = events.Tensors("val/generations/text_summary")
    assert text.step == 2
    assert tensor_util.make_ndarray(text.tensor_proto).item().decode() == (
        "| prompt | response | score |\n|---|---|---|\n| 1+1= | 2 | 1 |\n| 2+2=\\|? | 5<br>or 4 | 0 |")

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "elsewhere"))
    run_tracker(["tensorboard"], tmp_path / "run2")
    assert EventAccumulator(str(tmp_path / "elsewhere")).Reload().Scalars(VAL_KEY)[-1].value == 0.75


def wandb_records(path: str) -> list:
    """The protobuf records of a .wandb file. wandb 0.31 ships no Python reader, so this follows its format: a
    7-byte header (`:W&B`, magic, version), then LevelDB log chunks ([crc32c:4][length:2][type:1] + data, type 1 =
    whole record, 2/3/4 = first/middle/last piece) in 32 KiB blocks, a block's tail under 7 bytes being padding."""
    from wandb.proto import wandb_internal_pb2

    data, block = open(path, "rb").read(), 32 * 1024
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def test_wandb_without_a_key_runs_offline_logs_everything_and_leaves_no_process(tmp_path, monkeypatch, capsys):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_CONFIG_DIR", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings with a key
    monkeypatch.chdir(tmp_path)
    loggers = list(TrainerConfig().logger)
    assert loggers == ["console", "wandb"]  # verl's default, which must work on a machine without an account
    me = psutil.Process()
    before = set(me.children(recursive=True))
    tracker = Tracker(loggers, str(tmp_path / "run"), len(STEPS), project_name="proj", experiment_name="exp", config=CONFIG)
    started = set(me.children(recursive=True)) - before
    assert any(p.name() == "wandb-core" for p in started)
    for step, metrics in STEPS.items():
        if step == 2:
            tracker.log_generations(SAMPLES, step)
        tracker.log(metrics, step)
    tracker.close()
    _, alive = psutil.wait_procs(started, timeout=10)
    # Nothing new survives (a child from before may exit meanwhile: an earlier test's reaped zombie is not a leak).
    assert not alive and not set(me.children(recursive=True)) - before

    [run_dir] = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*"))
    assert f"`wandb sync {run_dir}` uploads it later" in capsys.readouterr().out
    records = wandb_records(glob.glob(os.path.join(run_dir, "run-*.wandb"))[0])
    [run] = [r.run for r in records if r.HasField("run")]
    assert (run.project, run.display_name) == ("proj", "exp")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["actor_rollout_ref"] == CONFIG["actor_rollout_ref"] and config["data"] == CONFIG["data"]
    history = {}
    for record in records:
        if record.HasField("history"):
            row = history.setdefault(record.history.step.num, {})
            row.update({item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    assert sorted(history) == [0, 1, 2]
    for step, metrics in STEPS.items():
        assert {key: history[step][key] for key in metrics} == metrics
    assert history[2]["val/generations._type"] == "table-file"
    table = json.load(open(os.path.join(run_dir, "files", history[2]["val/generations.path"])))
    assert table == {"columns": ["step", "prompt", "response", "score"], "data": [[2, *s] for s in SAMPLES]}


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_mlflow_run_holds_metrics_params_config_and_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "x")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # so that the backend's own opt-in for file: URIs is what runs
    run_tracker(["console", "mlflow"], tmp_path / "run")
    client = mlflow_client((tmp_path / "store").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert (run.info.run_name, run.info.status) == ("exp", "FINISHED")
    history = lambda key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]  # noqa: E731
    assert history("val-core/tiny_add/reward/mean_at_4") == [(0, 0.25), (2, 0.75)]  # `@` is not allowed: `_at_`
    assert history("perf/throughput") == [(1, 1024.0), (2, 2048.0)]
    assert history("timing_s/step") == [(1, 1.5), (2, 1.25)]
    assert run.data.params == {
        "actor_rollout_ref.actor.optim.lr": "1e-06", "data.train_files": '["a.parquet", "b.parquet"]',
        "trainer.project_name": "proj", "trainer.experiment_name": "exp", "trainer.logger": '["console", "mlflow"]',
    }
    artifacts = tmp_path / "downloaded"
    client.download_artifacts(run.info.run_id, "", str(artifacts))
    assert json.load(open(artifacts / "config.json")) == CONFIG
    assert json.load(open(artifacts / "val_generations" / "step_2.json")) == {
        "step": 2, "samples": [{"prompt": p, "response": r, "score": s} for p, r, s in SAMPLES]}


def test_mlflow_defaults_to_a_file_store_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "x")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    run_tracker(["mlflow"], tmp_path / "run")
    client = mlflow_client((tmp_path / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert [m.value for m in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [0.5, -0.25]


def test_mlflow_key_keeps_allowed_characters_and_spells_out_at():
    from rlcore.telemetry.tracker_backends import mlflow_key

    assert mlflow_key("val-core/gsm8k/reward/mean@4") == "val-core/gsm8k/reward/mean_at_4"
    assert mlflow_key("perf/throughput (tok/s)") == "perf/throughput _tok/s_"
    assert mlflow_key("/a//b/./c:d e.f/") == "a/b/c:d e.f"


def test_the_preflight_check_reports_logger_problems_before_ray_starts():
    from rlcore.cli.preflight import preflight
    from rlcore.config import compose

    errors = preflight(compose(["recipe=tiny_cpu", "trainer.logger=[console,tensorboard,swanlab]"]), "train").errors
    assert [e for e in errors if e.startswith("trainer.logger")] == [
        "trainer.logger=['console', 'tensorboard', 'swanlab']: unknown logger(s) ['swanlab']; valid: console, file, jsonl, "
        "tensorboard, wandb, mlflow (metrics always go to metrics.jsonl in the run directory)"]
    assert not [e for e in preflight(compose(["recipe=tiny_cpu", "trainer.logger=[console,wandb]"]), "train").errors if "logger" in e]


def test_the_progress_bar_is_drawn_at_the_first_step_after_what_the_start_prints(tmp_path, capsys):
    """What prints while the workers start (Ray's token notice, the rank map) landed inside the bar's line when it
    was drawn with the tracker: it now appears with the first step."""
    tracker = Tracker(["console"], str(tmp_path), 3)
    try:
        assert tracker.progress is None
        print("Token authentication is enabled for this Ray cluster.")
        tracker.advance()
        assert tracker.progress is not None and tracker.progress.n == 1
    finally:
        tracker.close()
    err = capsys.readouterr().err
    assert "training:" in err and tracker.closing == []
