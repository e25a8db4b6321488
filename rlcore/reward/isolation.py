"""Reward calls that cannot take the run down: each `compute_score` runs in a worker process with a per-sample
time limit, and an exception or a timeout costs that sample a default score instead of the run (until too many
samples of a step fail, which stops the run with the first error).

A hung scorer (a stuck sandbox, an HTTP call without a timeout) can only be stopped from outside its process, so
the scorers run in `reward_model.score_workers` spawned processes, one call at a time each: a call still running
`score_timeout_s` after it started has its process killed and replaced, while the other processes go on with the
rest of the batch. The processes also keep a slow scorer from serialising the step on the controller.
score_workers=0 calls the scorer in the controller (no timeout: for debugging a scorer).

Waiting calls overlap (rlcore.utils.process_pool): a call still running after the pool's suspect time (2 s, or a
quarter of score_timeout_s if that is shorter) is parked -- it keeps its process and its whole score_timeout_s --
while fresh processes score the next samples, so a slow scorer (an LLM judge, a sandbox) runs on more processes than
score_workers and hung calls wait out their timeouts side by side. The pool is back to score_workers processes after
each step.

A step's scoring is bounded: given `max_failures` (the step's tolerance, floor(max_error_rate x n)), scoring stops
at the failure that passes it, killing the calls still running, and the step holds at most score_workers +
max_failures + 1 processes (at most 64): enough for the max_failures + 1 hung calls that end it to run side by side.
A step whose samples hang thus fails about one score_timeout_s after it starts (plus parking and the fresh
processes' set-up, seconds), whatever its size while max_failures + 1 + score_workers <= 64 (n up to ~600 at the
default max_error_rate 0.1); beyond that the hung calls wait in rounds of up to 64 -- instead of every hung sample
queueing behind score_workers processes (ceil((max_failures + 1) / score_workers) timeouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

from rlcore.utils.process_pool import ProcessPool, call_catching, serve


def _serve(conn: Connection, custom_path: str | None, custom_name: str) -> None:
    """A scoring process: loads the scorer once, then answers one request at a time until the pipe closes."""
    from rlcore.reward.custom import load_custom_reward_fn
    from rlcore.reward.scorers import default_compute_score

    fn = load_custom_reward_fn(custom_path, custom_name) or default_compute_score
    serve(conn, lambda kwargs: call_catching(fn, **kwargs))


@dataclass
class ScoreFailure:
    kind: str  # "error" | "timeout"
    message: str


class IsolatedScorer:
    """`score_all(requests)`: one result (or ScoreFailure) per request dict of compute_score keywords."""

    def __init__(self, compute_score: Callable[..., Any], custom_path: str | None, custom_name: str, workers: int, timeout_s: float) -> None:
        self.compute_score, self.workers, self.timeout_s = compute_score, workers, timeout_s
        self.pool = ProcessPool(_serve, (custom_path, custom_name), workers, timeout_s)

    @property
    def procs(self) -> list:
        """The scoring processes (each has `.process`), for tests."""
        return self.pool.procs

    def score_all(self, requests: list[dict[str, Any]], max_failures: int | None = None) -> list[Any]:
        """One result or ScoreFailure per request. With `max_failures`, returns as soon as more than that many
        requests have failed: the calls still running are killed and the requests not scored yet are None."""
        limit = len(requests) if max_failures is None else max_failures
        if self.workers == 0:
            return self._score_in_controller(requests, limit)
        failures = {"error": lambda value: ScoreFailure("error", value),
                    "died": lambda _: ScoreFailure("error", "the scoring process died (os._exit, a signal or a crash in compute_score)"),
                    "timeout": lambda _: ScoreFailure("timeout", f"no score within reward_model.score_timeout_s={self.timeout_s:g}s")}
        return [None if o is None else o.value if o.status == "ok" else failures[o.status](o.value)
                for o in self.pool.run(requests, max_failures=limit)]

    def _score_in_controller(self, requests: list[dict[str, Any]], limit: int) -> list[Any]:
        results: list[Any] = [None] * len(requests)
        failed = 0
        for i, request in enumerate(requests):
            ok, result = call_catching(self.compute_score, **request)
            results[i] = result if ok else ScoreFailure("error", result)
            failed += not ok
            if failed > limit:
                break
        return results

    def close(self) -> None:
        self.pool.close()
