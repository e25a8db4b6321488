"""A stop signal honoured at a step boundary: what Slurm and Kubernetes send a preempted job before they kill it.

While a trainer's loop runs inside `deferred_stop()`, the first SIGTERM only sets `requested` (and says so on
stderr); the loop finishes the step in flight, writes a checkpoint, prints one line and exits with EXIT_CODE. A
second SIGTERM raises `StopNow` at once, wherever the driver is: no checkpoint, the workers killed rather than
shut down, Ray stopped on the way out (rlcore.controller.ray_session). Outside the loop (set-up, validation before
the first step) SIGTERM keeps rlcore.controller.ray_session's meaning: stop at once, there being nothing to save.

The bound, signal -> checkpoint written: the rest of the step in flight (each worker call in it is itself bounded by
trainer.hang_timeout_s) plus one checkpoint save; the exit follows after the workers' graceful shutdown and
ray.shutdown() (seconds). The driver must be in its main thread (Python runs signal handlers there only), after
ray.init: Ray installs a SIGTERM handler of its own that this replaces for the loop's duration.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

EXIT_CODE = 128 + signal.SIGTERM  # 143, as a process ended by SIGTERM: the job scheduler's "terminated"


class StopNow(SystemExit):
    """A second SIGTERM: stop without finishing the step (the workers may be mid-collective: kill, do not shut down)."""


class DeferredStop:
    """The state of one `deferred_stop()` block: whether SIGTERM came, and when (time.monotonic())."""

    def __init__(self) -> None:
        self.signalled_at: float | None = None
        self.escalated = False  # a second SIGTERM came: StopNow was raised

    @property
    def requested(self) -> bool:
        return self.signalled_at is not None

    def seconds_since_signal(self) -> float:
        return time.monotonic() - self.signalled_at

    def handle(self, signum, frame) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            # os.write, not print: the handler may interrupt a print to the same buffered stream (a reentrant call)
            os.write(2, b"\nrlcore: SIGTERM received: finishing the step in flight, then a checkpoint and exit; "
                        b"a second SIGTERM stops at once without one\n")
            return
        self.escalated = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a third one, during the clean-up below, kills outright
        os.write(2, b"\nrlcore: second SIGTERM: stopping now, without a checkpoint\n")
        raise StopNow(EXIT_CODE)


@contextmanager
def deferred_stop():
    """Yields a DeferredStop whose `requested` a loop checks at its step boundaries. Off the main thread no handler
    can be installed: `requested` then stays False and SIGTERM keeps whatever meaning it had."""
    stop = DeferredStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, stop.handle)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)
        # The signal was deferred, not swallowed: whoever handled SIGTERM before the loop hears of it now (the Ray
        # session stops the run; a test session's handler ends the session instead of running the next test).
        # (After a second signal the stop was immediate already: StopNow is on its way out.)
        if stop.requested and not stop.escalated and callable(previous) and previous is not signal.default_int_handler:
            previous(signal.SIGTERM, None)


def stop_line(step: int, total_steps: int, checkpoint: str | None, seconds: float, resume_hint: str) -> str:
    """The one line a preempted run ends with: where it stopped, what it saved `seconds` after the signal, how to
    go on."""
    saved = f"checkpoint {checkpoint} written {seconds:.1f} s after the signal" if checkpoint else "no checkpoint"
    return f"rlcore: stopped by SIGTERM after global step {step} of {total_steps}: {saved}; {resume_hint} (exit code {EXIT_CODE})"


def say(line: str) -> None:
    """A line of its own on stdout, above the console logger's progress bar."""
    from tqdm import tqdm

    tqdm.write(line)
    sys.stdout.flush()


def resume_hint(trainer_cfg, checkpoint: str | None) -> str:
    """How to continue from `checkpoint` under the run's trainer.resume_mode."""
    if checkpoint is None:
        return "nothing to resume from: rerun the command to start over"
    if trainer_cfg.resume_mode == "auto":
        return f"to resume, rerun the command with trainer.default_local_dir={os.path.dirname(checkpoint)}"
    return f"to resume, rerun the command with trainer.resume_mode=resume_path trainer.resume_from_path={checkpoint}"
