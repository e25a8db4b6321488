"""The external trackers behind `trainer.logger`: tensorboard, wandb, mlflow (installed by `rlcore[tracking]`).

Each backend imports its package in `__init__`, so choosing none of them costs nothing; `requires` names the module
that `logger_errors` looks for before Ray starts. The Tracker (tracking.py) sends each of them every metric dict
and every batch of validation samples.
"""

from __future__ import annotations

import json
import numbers
import os
import pathlib
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

CONSOLE_KEYS = (
    "critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "response_length/mean",
    "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
)


@dataclass
class RunInfo:
    """What a backend opens its run with."""

    run_dir: str  # the run directory: metrics.jsonl, and wandb's files unless WANDB_DIR is set
    project_name: str  # trainer.project_name: wandb project, mlflow experiment, tensorboard folder
    experiment_name: str  # trainer.experiment_name: the run's name in every backend
    config: dict = field(default_factory=dict)  # the resolved config: wandb config, mlflow params + config.json
    console_keys: tuple[str, ...] = CONSOLE_KEYS  # metrics shown on each console line


GENERATIONS_KEY = "val/generations"  # where the validation samples go (wandb table, tensorboard text), as in verl
MLFLOW_PARAM_VALUE_MAX_CHARS = 6000  # mlflow's MAX_PARAM_VAL_LENGTH; longer values are cut (config.json has them whole)


class TensorboardBackend:
    """Event files under $TENSORBOARD_DIR, else tensorboard_log/{project_name}/{experiment_name} relative to the
    working directory (verl's default): one scalar per metric per step, the validation samples as a markdown table."""

    requires = ("tensorboard", "tensorboard")

    def __init__(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join("tensorboard_log", info.project_name, info.experiment_name)
        self.writer = SummaryWriter(self.log_dir)
        print(f"tensorboard: event files in {os.path.abspath(self.log_dir)}", flush=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(key, value, step)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        self.writer.add_text(GENERATIONS_KEY, _markdown_table(samples), step)

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """A wandb run: project = project_name, name = experiment_name, config = the resolved config.

    With no credentials and no mode chosen (WANDB_MODE unset, no `wandb offline`), the run is logged offline
    instead of failing or prompting, so verl's default `trainer.logger=[console,wandb]` works on any machine; it says
    once where the run is and how to upload it. Files go to the run directory unless WANDB_DIR is set."""

    requires = ("wandb", "wandb")

    def __init__(self, info: RunInfo) -> None:
        import wandb

        offline = _wandb_should_go_offline()
        self.run = wandb.init(project=info.project_name, name=info.experiment_name, config=info.config,
                              dir=None if os.environ.get("WANDB_DIR") else info.run_dir, mode="offline" if offline else None)
        if offline:
            sync_dir = os.path.abspath(self.run.settings.sync_dir)
            print(f"wandb: no API key (WANDB_API_KEY, ~/.netrc or `wandb login`), so this run is logged offline in "
                  f"{sync_dir}; `wandb sync {sync_dir}` uploads it later", flush=True)
        self.generation_rows: list[list] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        import wandb

        # Each validation logs a table of all samples so far (as verl does), so the latest one shows the history.
        self.generation_rows += [[step, prompt, response, score] for prompt, response, score in samples]
        table = wandb.Table(columns=["step", "prompt", "response", "score"], data=self.generation_rows)
        self.run.log({GENERATIONS_KEY: table}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # stops the wandb-core service process now rather than at interpreter exit


def _wandb_should_go_offline() -> bool:
    """No mode was chosen (WANDB_MODE unset, wandb's settings at their default `online`) and there are no credentials:
    no WANDB_API_KEY / WANDB_IDENTITY_TOKEN_FILE, no key in the netrc file or wandb's settings. This is wandb's own
    lookup (wandb.sdk.lib.wbauth, as in wandb 0.31): it reads the environment and files only, never the network, and
    with prompt=False it never asks."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    settings = wandb_setup.singleton().settings
    if os.environ.get("WANDB_MODE") or settings.mode != "online":
        return False
    host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
    return wbauth.authenticate_session(host=host, source="rlcore", prompt=False, update_session=False) is None


class MlflowBackend:
    """An mlflow run in experiment project_name, named experiment_name, at $MLFLOW_TRACKING_URI, else a file store in
    ./mlruns. Params are the flattened config (values cut at mlflow's 6000 characters; the whole config is also the
    artifact config.json); metric and param names go through `mlflow_key`; validation samples are JSON artifacts
    val_generations/step_{step}.json (mlflow.log_table needs pandas, which mlflow-skinny lacks)."""

    requires = ("mlflow", "mlflow-skinny")

    def __init__(self, info: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or pathlib.Path("mlruns").absolute().as_uri()
        if urlparse(uri).scheme in ("", "file"):
            # mlflow 3.x refuses its file store unless MLFLOW_ALLOW_FILE_STORE is set; asking for a file store (the
            # default here, or a file: URI) is that opt-in. An explicit MLFLOW_ALLOW_FILE_STORE=false still wins.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(info.project_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(info.project_name)
        self.run_id = self.client.create_run(experiment_id, run_name=info.experiment_name).info.run_id
        params = [Param(mlflow_key(key), value[:MLFLOW_PARAM_VALUE_MAX_CHARS]) for key, value in _flatten(info.config).items()]
        self.client.log_batch(self.run_id, params=params)  # the client sends them in batches of mlflow's 100
        self._log_json(info.config, "config.json")
        print(f"mlflow: run {self.run_id} in experiment {info.project_name!r} at {uri}", flush=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        rows = [Metric(mlflow_key(key), value, timestamp_ms, step) for key, value in _scalars(metrics).items()]
        self.client.log_batch(self.run_id, metrics=rows)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        rows = [{"prompt": prompt, "response": response, "score": score} for prompt, response, score in samples]
        self._log_json({"step": step, "samples": rows}, f"val_generations/step_{step}.json")

    def _log_json(self, obj: dict, artifact_file: str) -> None:
        # log_text with our own json.dumps: default=str keeps any odd config value (an enum) from failing the run
        self.client.log_text(self.run_id, json.dumps(obj, indent=1, default=str), artifact_file)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
    """A metric/param name mlflow accepts. Its rule (mlflow.utils.validation): only alphanumerics, `_ - . / : `
    and spaces, and a name that is a normalized path. So `@` becomes `_at_` (verl's choice:
    `val-core/gsm8k/reward/mean@4` -> `val-core/gsm8k/reward/mean_at_4`), any other character `_`, and empty or
    `.` path segments are dropped. Distinct rlcore keys stay distinct unless they differ only in those characters."""
    key = re.sub(r"[^\w\-./: ]", "_", key.replace("@", "_at_"))
    return "/".join(part for part in key.split("/") if part not in ("", "."))


def _scalars(metrics: dict) -> dict[str, float]:
    """The numeric metrics as floats (tensorboard and mlflow take numbers only; metrics.jsonl keeps everything)."""
    return {key: float(value) for key, value in metrics.items() if isinstance(value, numbers.Real)}


def _flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1e-6}}` -> `{"a.b": "1e-06"}`: strings as they are, other leaves (lists too) as JSON."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def _markdown_table(samples: list[tuple[str, str, float]]) -> str:
    """The samples as a markdown table (tensorboard's text plugin renders it); `|` escaped, newlines as <br>."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", "<br>")

    rows = [f"| {cell(prompt)} | {cell(response)} | {score:g} |" for prompt, response, score in samples]
    return "\n".join(["| prompt | response | score |", "|---|---|---|", *rows])
