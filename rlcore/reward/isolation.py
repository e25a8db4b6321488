"""Reward calls that cannot take the run down: each `compute_score` runs in a worker process with a per-sample
time limit, and an exception or a timeout costs that sample a default score instead of the run (until too many
samples of a step fail, which stops the run with the first error).

A hung scorer (a stuck sandbox, an HTTP call without a timeout) can only be stopped from outside its process, so
the scorers run in a pool of `reward_model.score_workers` spawned processes; a pool with a hung call is killed and
replaced. The pool also keeps a slow scorer from serialising the step on the controller. score_workers=0 calls the
scorer in the controller (no timeout: for debugging a scorer).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

_WORKER_FN: Callable[..., Any] | None = None
_BROKEN = object()  # a call lost with its pool


def _init_worker(custom_path: str | None, custom_name: str) -> None:
    global _WORKER_FN
    from rlcore.reward.custom import load_custom_reward_fn
    from rlcore.reward.scorers import default_compute_score

    _WORKER_FN = load_custom_reward_fn(custom_path, custom_name) or default_compute_score


def _call(fn: Callable[..., Any] | None, kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(True, the scorer's result) or (False, the exception's last traceback line)."""
    try:
        return True, (fn or _WORKER_FN)(**kwargs)
    except Exception as err:  # noqa: BLE001: any scorer failure becomes a per-sample error
        return False, traceback.format_exception_only(type(err), err)[-1].strip()


@dataclass
class ScoreFailure:
    kind: str  # "error" | "timeout"
    message: str


class IsolatedScorer:
    """`score_all(requests)`: one result (or ScoreFailure) per request dict of compute_score keywords."""

    def __init__(self, compute_score: Callable[..., Any], custom_path: str | None, custom_name: str, workers: int, timeout_s: float) -> None:
        self.compute_score, self.custom = compute_score, (custom_path, custom_name)
        self.workers, self.timeout_s = workers, timeout_s
        self.pool: cf.ProcessPoolExecutor | None = None

    def _pool(self) -> cf.ProcessPoolExecutor:
        if self.pool is None:
            # spawn: the controller runs Ray's threads and torch; forking it is not safe.
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=_init_worker, initargs=self.custom)
        return self.pool

    def score_all(self, requests: list[dict[str, Any]]) -> list[Any]:
        if self.workers == 0:
            return [result if ok else ScoreFailure("error", result) for ok, result in (_call(self.compute_score, r) for r in requests)]
        results = self._run(requests)
        # A scorer that kills its process breaks the whole pool and every call still in it: score those again one
        # by one in fresh pools, so only the culprit fails.
        for i in [i for i, r in enumerate(results) if r is _BROKEN]:
            (results[i],) = self._run([requests[i]])
        return [ScoreFailure("error", "the scoring process died (os._exit, a signal or a crash in compute_score)") if r is _BROKEN else r
                for r in results]

    def _run(self, requests: list[dict[str, Any]]) -> list[Any]:
        futures = [self._pool().submit(_call, None, r) for r in requests]
        # Each call gets timeout_s; calls queue behind each other on `workers` processes.
        deadline = time.monotonic() + self.timeout_s * math.ceil(len(requests) / self.workers) + 5.0
        done, _ = cf.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        results: list[Any] = []
        for future in futures:
            if future not in done:
                results.append(ScoreFailure("timeout", f"no score within reward_model.score_timeout_s={self.timeout_s:g}s"))
            elif isinstance(future.exception(), cf.process.BrokenProcessPool):
                results.append(_BROKEN)
            else:
                ok, result = future.result()
                results.append(result if ok else ScoreFailure("error", result))
        if len(done) < len(futures) or _BROKEN in results:
            self.close(kill=True)  # a hung or broken pool is replaced on the next call
        return results

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.kill()
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        self.pool = None
