"""Reward calls that cannot take the run down: each `compute_score` runs in a worker process with a per-sample
time limit, and an exception or a timeout costs that sample a default score instead of the run (until too many
samples of a step fail, which stops the run with the first error).

A hung scorer (a stuck sandbox, an HTTP call without a timeout) can only be stopped from outside its process, so
the scorers run in `reward_model.score_workers` spawned processes, one call at a time each: a call still running
`score_timeout_s` after it started has its process killed and replaced, while the other processes go on with the
rest of the batch. The processes also keep a slow scorer from serialising the step on the controller.
score_workers=0 calls the scorer in the controller (no timeout: for debugging a scorer).

A step's scoring is bounded: given `max_failures` (the step's tolerance, floor(max_error_rate x n)), scoring stops
at the failure that passes it, killing the calls still running, so at most max_failures + 1 timeouts are ever
waited for -- score_workers of them side by side -- instead of every hung sample queueing behind the workers.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(True, the scorer's result) or (False, the exception's last traceback line)."""
    try:
        return True, fn(**kwargs)
    except Exception as err:  # noqa: BLE001: any scorer failure becomes a per-sample error
        return False, traceback.format_exception_only(type(err), err)[-1].strip()


def _serve(conn: Connection, custom_path: str | None, custom_name: str) -> None:
    """A scoring process: loads the scorer once, then answers one request at a time until the pipe closes."""
    from rlcore.reward.custom import load_custom_reward_fn
    from rlcore.reward.scorers import default_compute_score

    fn = load_custom_reward_fn(custom_path, custom_name) or default_compute_score
    while True:
        try:
            kwargs = conn.recv()
        except EOFError:
            return
        conn.send(_call(fn, kwargs))


@dataclass
class ScoreFailure:
    kind: str  # "error" | "timeout"
    message: str


class _Proc:
    def __init__(self, ctx, custom: tuple[str | None, str]) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, *custom), daemon=True)
        self.process.start()
        child.close()
        self.job: int | None = None  # index of the request it is scoring
        self.started = 0.0

    def stop(self) -> None:
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


class IsolatedScorer:
    """`score_all(requests)`: one result (or ScoreFailure) per request dict of compute_score keywords."""

    def __init__(self, compute_score: Callable[..., Any], custom_path: str | None, custom_name: str, workers: int, timeout_s: float) -> None:
        self.compute_score, self.custom = compute_score, (custom_path, custom_name)
        self.workers, self.timeout_s = workers, timeout_s
        self.procs: list[_Proc] = []
        self.ctx = multiprocessing.get_context("spawn")  # the controller runs Ray's threads and torch: never fork it

    def score_all(self, requests: list[dict[str, Any]], max_failures: int | None = None) -> list[Any]:
        """One result or ScoreFailure per request. With `max_failures`, returns as soon as more than that many
        requests have failed: the calls still running are killed and the requests not scored yet are None."""
        limit = len(requests) if max_failures is None else max_failures
        if self.workers == 0:
            return self._score_in_controller(requests, limit)
        while len(self.procs) < self.workers:
            self.procs.append(_Proc(self.ctx, self.custom))
        results: list[Any] = [None] * len(requests)
        queue, left, failed = list(range(len(requests))), len(requests), 0
        while left and failed <= limit:
            for i, proc in enumerate(self.procs):
                if proc.job is None and queue:
                    if not proc.process.is_alive():  # died between batches
                        proc.stop()
                        proc = self.procs[i] = _Proc(self.ctx, self.custom)
                    proc.job, proc.started = queue.pop(0), time.monotonic()
                    proc.conn.send(requests[proc.job])
            busy = [p for p in self.procs if p.job is not None]
            timeout = max(0.0, min(p.started for p in busy) + self.timeout_s - time.monotonic())
            ready = wait([p.conn for p in busy], timeout=timeout)
            for i, proc in enumerate(list(self.procs)):
                if failed > limit:  # the step has failed: the other calls that ended meanwhile change nothing
                    break
                if proc.job is None:
                    continue
                if proc.conn in ready:
                    try:
                        ok, result = proc.conn.recv()
                        results[proc.job] = result if ok else ScoreFailure("error", result)
                        proc.job, left, failed = None, left - 1, failed + (not ok)
                        continue
                    except (EOFError, OSError):  # the scorer took its process down (os._exit, a signal, a crash)
                        results[proc.job] = ScoreFailure("error", "the scoring process died (os._exit, a signal or a crash in compute_score)")
                elif time.monotonic() - proc.started >= self.timeout_s:
                    results[proc.job] = ScoreFailure("timeout", f"no score within reward_model.score_timeout_s={self.timeout_s:g}s")
                else:
                    continue
                left, failed = left - 1, failed + 1
                proc.stop()
                self.procs[i] = _Proc(self.ctx, self.custom)  # a fresh process for the rest of the batch
        if left:  # stopped early: the step fails anyway, so the calls still running are not waited for
            for proc in [p for p in self.procs if p.job is not None]:
                proc.stop()
                self.procs.remove(proc)  # the next batch starts fresh ones
        return results

    def _score_in_controller(self, requests: list[dict[str, Any]], limit: int) -> list[Any]:
        results: list[Any] = [None] * len(requests)
        failed = 0
        for i, request in enumerate(requests):
            ok, result = _call(self.compute_score, request)
            results[i] = result if ok else ScoreFailure("error", result)
            failed += not ok
            if failed > limit:
                break
        return results

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs = []
