"""Where metrics go: the console (a compact line per step under a progress bar) and a JSONL file."""

from __future__ import annotations

import json
import math
import os

from tqdm import tqdm

CONSOLE_KEYS = (
    "critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "response_length/mean",
    "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
)
SUPPORTED_LOGGERS = ("console", "jsonl")


def logger_errors(loggers: list[str]) -> list[str]:
    """Config problems with trainer.logger (checked with everything else before Ray starts)."""
    unsupported = [name for name in loggers if name not in SUPPORTED_LOGGERS]
    if not unsupported:
        return []
    return [f"trainer.logger={list(loggers)}: {unsupported} not supported yet by rlcore; use "
            f"trainer.logger=[{','.join(SUPPORTED_LOGGERS)}] (metrics always go to metrics.jsonl in the run directory)"]


class Tracker:
    def __init__(self, loggers: list[str], run_dir: str, total_steps: int, start_step: int = 0, console_keys: tuple[str, ...] | None = None) -> None:
        errors = logger_errors(loggers)
        if errors:
            raise ValueError(errors[0])
        self.console = "console" in loggers
        self.console_keys = CONSOLE_KEYS if console_keys is None else console_keys
        os.makedirs(run_dir, exist_ok=True)
        # The JSONL file is always written: it is the run's machine-readable record (tests and sweeps read it).
        self.jsonl_path = os.path.join(run_dir, "metrics.jsonl")
        self._file = open(self.jsonl_path, "a")
        self.progress = tqdm(total=total_steps, initial=start_step, desc="training", disable=not self.console, dynamic_ncols=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()
        if self.console:
            shown = " - ".join(f"{k}:{_fmt(metrics[k])}" for k in self.console_keys if k in metrics)
            val = " - ".join(f"{k}:{_fmt(v)}" for k, v in metrics.items() if k.startswith("val-core/"))
            self.progress.write(f"step:{step} - {shown}{' - ' + val if val else ''}")

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """trainer.log_val_generations: a few validation samples, to see what the policy actually writes."""
        self._file.write(json.dumps({"step": step, "val_generations": [list(s) for s in samples]}) + "\n")
        if self.console:
            for prompt, response, score in samples:
                self.progress.write(f"[val step {step}] {prompt!r} -> {response!r} score={score:g}")

    def advance(self) -> None:
        self.progress.update(1)

    def close(self) -> None:
        self.progress.close()
        self._file.close()


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value != 0 and abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
