"""Where metrics go: `trainer.logger` picks the backends by verl's names; the Tracker fans every call out to them.

`metrics.jsonl` in the run directory is always written (tests, sweeps and the reliability checks read it);
`console` adds a compact line per step under a progress bar; tensorboard, wandb and mlflow live in
`tracker_backends.py` and import their package only when selected.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from typing import Protocol

from tqdm import tqdm

from rlcore.telemetry.tracker_backends import CONSOLE_KEYS, MlflowBackend, RunInfo, TensorboardBackend, WandbBackend


class Backend(Protocol):
    """One tracker: built from a RunInfo, it receives every log call until close()."""

    requires: tuple[str, str] | None  # (module, pip package) it imports; None: nothing beyond rlcore's dependencies

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None: ...

    def close(self) -> None: ...


class ConsoleBackend:
    """One line per step (the console keys, then any val-core/* metric), written above the progress bar."""

    requires = None

    def __init__(self, info: RunInfo) -> None:
        self.console_keys = info.console_keys

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = [f"{k}:{_fmt(metrics[k])}" for k in self.console_keys if k in metrics]
        val = [f"{k}:{_fmt(v)}" for k, v in metrics.items() if k.startswith("val-core/")]
        tqdm.write(" - ".join([f"step:{step}", *shown, *val]))

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        for prompt, response, score in samples:
            tqdm.write(f"[val step {step}] {prompt!r} -> {response!r} score={score:g}")

    def close(self) -> None:
        pass


class JsonlBackend:
    """`metrics.jsonl` in the run directory: one JSON object per log call, flushed at once (a killed run keeps it)."""

    requires = None

    def __init__(self, info: RunInfo) -> None:
        self.path = os.path.join(info.run_dir, "metrics.jsonl")
        self._file = open(self.path, "a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._write({"step": step, **metrics})

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        self._write({"step": step, "val_generations": [list(s) for s in samples]})

    def _write(self, row: dict) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# trainer.logger name -> backend (verl's names; `file` and `jsonl` are both metrics.jsonl, which is written anyway)
BACKENDS = {
    "console": ConsoleBackend, "file": JsonlBackend, "jsonl": JsonlBackend,
    "tensorboard": TensorboardBackend, "wandb": WandbBackend, "mlflow": MlflowBackend,
}


def _module_available(module: str) -> bool:
    """Whether `module` can be imported, without importing it (cheap enough for the pre-flight check)."""
    return importlib.util.find_spec(module) is not None


def logger_names(value) -> list[str]:
    """trainer.logger as a list: verl takes one name as a string (`trainer.logger=console`) or a list."""
    return [value] if isinstance(value, str) else list(value)


def logger_errors(loggers: list[str]) -> list[str]:
    """Config problems with trainer.logger: unknown names, and backends whose package is not installed (checked
    with everything else before Ray starts, not when the first metric is logged)."""
    errors = []
    unknown = [name for name in loggers if name not in BACKENDS]
    if unknown:
        errors.append(f"trainer.logger={list(loggers)}: unknown logger(s) {unknown}; valid: {', '.join(BACKENDS)} "
                      f"(metrics always go to metrics.jsonl in the run directory)")
    for name in dict.fromkeys(loggers):
        requires = BACKENDS[name].requires if name in BACKENDS else None
        if requires and not _module_available(requires[0]):
            errors.append(f"trainer.logger has {name!r} but the {requires[0]} package is not installed: "
                          f"pip install 'rlcore[tracking]' (or pip install {requires[1]})")
    return errors


class Tracker:
    """Sends every metric dict and every batch of validation samples to each selected backend, and draws the
    progress bar (shown with `console`)."""

    def __init__(self, loggers: list[str], run_dir: str, total_steps: int, start_step: int = 0,
                 console_keys: tuple[str, ...] | None = None, *, project_name: str = "rlcore",
                 experiment_name: str | None = None, config: dict | None = None) -> None:
        errors = logger_errors(loggers)
        if errors:
            raise ValueError("\n".join(errors))
        os.makedirs(run_dir, exist_ok=True)
        info = RunInfo(run_dir, project_name, experiment_name or os.path.basename(os.path.abspath(run_dir)),
                       config or {}, CONSOLE_KEYS if console_keys is None else console_keys)
        self.backends: list[Backend] = []
        try:
            for backend in dict.fromkeys(BACKENDS[name] for name in ["jsonl", *loggers]):
                self.backends.append(backend(info))
        except BaseException:
            self._close_backends()  # e.g. wandb started its service, then mlflow failed: stop the service too
            raise
        self.jsonl_path = self.backends[0].path  # the JsonlBackend: always first
        # Drawn at the first step, not now: what prints while the workers start (Ray's notices, the rank map) would
        # otherwise land inside the bar's line.
        self._bar = dict(total=total_steps, initial=start_step, desc="training", disable="console" not in loggers, dynamic_ncols=True)
        self.progress: tqdm | None = None
        self.closing: list[str] = []  # lines for the end of the run, after its report (where the checkpoint went, ...)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """trainer.log_val_generations: a few validation samples, to see what the policy actually writes."""
        for backend in self.backends:
            backend.log_generations(samples, step)

    def advance(self) -> None:
        if self.progress is None:
            self.progress = tqdm(**self._bar)
        self.progress.update(1)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        self._close_backends()

    def _close_backends(self) -> None:
        for backend in self.backends:
            backend.close()


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value != 0 and abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
