"""Calls that cannot take the caller down: a pool of spawned processes, each serving one request at a time over a
pipe, with a per-call time limit.

A hung call (a stuck sandbox, an HTTP request without a timeout) can only be stopped from outside its process, so a
call still running `timeout_s` after it started has its process killed and replaced while the other processes go on;
a call that takes its process down (os._exit, a signal, a segfault) costs only that call. Reward scorers
(rlcore.reward.isolation) and tools (rlcore.tools.runner) run this way. Processes are spawned, never forked: the
caller runs Ray's threads and torch. A call's time limit starts once its process is set up (it says READY): a
spawned process's imports take seconds, more on a loaded machine, and would otherwise time out its first calls.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence


def call_catching(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """(True, fn's result) or (False, "ExceptionType: message", the exception's last traceback line)."""
    try:
        return True, fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001: any failure of user code becomes that call's error
        return False, traceback.format_exception_only(type(err), err)[-1].strip()


READY = "ready"  # a process's first message: set up (imports done, tools built), its calls' time limits start now
# How long a process may take to get READY before its call fails: a spawned Python re-imports the caller's main module
# and its own (torch, transformers, Ray's worker) -- seconds, more on a loaded machine -- which must not count
# against a call's timeout_s, yet a process stuck in its set-up must not hang the step either.
STARTUP_TIMEOUT_S = 300.0


def serve(conn: Connection, handle: Callable[[Any], tuple[bool, Any]]) -> None:
    """A pool process's loop: says READY, then answers each request with handle(request) until the parent closes
    the pipe. Call it once the handler is built."""
    conn.send(READY)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        conn.send(handle(request))


@dataclass
class Outcome:
    """How one call ended: status "ok" (value: the result), "error" (value: "ExceptionType: message"), "timeout"
    or "died" (value None; the process was killed or had died, and has been replaced)."""

    status: str
    value: Any = None


class _Proc:
    def __init__(self, ctx, target: Callable[..., None], args: tuple) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()
        child.close()
        self.job: int | None = None  # index of the request it is serving
        self.spawned = time.monotonic()
        self.ready = False  # sent READY: its set-up is done
        self.started = 0.0  # when its current call started (was sent, or the process got ready, whichever is later)

    def deadline(self, timeout_s: float) -> float:
        return self.started + timeout_s if self.ready else self.spawned + STARTUP_TIMEOUT_S

    def stop(self) -> None:
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


class ProcessPool:
    """`num_workers` processes running `target(conn, *args)` (which calls `serve`); `run` spreads requests over them.

    The processes start on the first `run`; a killed or dead one is replaced when it is next given a request."""

    def __init__(self, target: Callable[..., None], args: tuple, num_workers: int, timeout_s: float) -> None:
        self.target, self.args, self.num_workers, self.timeout_s = target, args, num_workers, timeout_s
        self.procs: list[_Proc] = []
        self.ctx = multiprocessing.get_context("spawn")

    def run(self, requests: Sequence[Any], workers: Sequence[int | None] | None = None,
            max_failures: int | None = None) -> list[Outcome | None]:
        """One Outcome per request, in request order. `workers[i]`: the process that must serve request i (state kept
        in a process stays with its requests), None: any free one. With `max_failures`, returns as soon as more than
        that many calls have failed: the calls still running are killed and the requests not run yet are None."""
        limit = len(requests) if max_failures is None else max_failures
        while len(self.procs) < self.num_workers:
            self.procs.append(_Proc(self.ctx, self.target, self.args))
        queues: list[list[int]] = [[] for _ in self.procs]
        shared: list[int] = []
        for i in range(len(requests)):
            (shared if workers is None or workers[i] is None else queues[workers[i]]).append(i)
        outcomes: list[Outcome | None] = [None] * len(requests)
        left, failed = len(requests), 0
        while left and failed <= limit:
            for w, proc in enumerate(self.procs):
                queue = queues[w] or shared
                if proc.job is None and queue:
                    if not proc.process.is_alive():  # died or was killed since its last call
                        proc = self._replace(w)
                    proc.job, proc.started = queue.pop(0), time.monotonic()
                    proc.conn.send(requests[proc.job])
            busy = [p for p in self.procs if p.job is not None]
            ready = wait([p.conn for p in busy], timeout=max(0.0, min(p.deadline(self.timeout_s) for p in busy) - time.monotonic()))
            for w, proc in enumerate(self.procs):
                if failed > limit:  # the caller gives up: the calls that ended meanwhile change nothing
                    break
                if proc.job is None:
                    continue
                if proc.conn in ready:
                    try:
                        message = proc.conn.recv()
                    except (EOFError, OSError):  # the call (or the set-up) took its process down
                        outcome = Outcome("died")
                    else:
                        if not proc.ready:  # READY: the call waiting in its pipe starts now
                            proc.ready, proc.started = True, time.monotonic()
                            continue
                        ok, value = message
                        outcome = Outcome("ok" if ok else "error", value)
                elif time.monotonic() >= proc.deadline(self.timeout_s):
                    outcome = Outcome("timeout") if proc.ready else Outcome("died")
                else:
                    continue
                outcomes[proc.job], proc.job = outcome, None
                left, failed = left - 1, failed + (outcome.status != "ok")
                if outcome.status in ("died", "timeout"):
                    self._replace(w)  # a fresh process for the rest of the requests
        for proc in self.procs:  # stopped early: the calls still running are not waited for
            if proc.job is not None:
                proc.job = None
                proc.stop()  # replaced when next needed
        return outcomes

    def _replace(self, w: int) -> _Proc:
        self.procs[w].stop()
        self.procs[w] = _Proc(self.ctx, self.target, self.args)
        return self.procs[w]

    def close(self) -> None:
        """Stops every process (a later `run` starts fresh ones)."""
        for proc in self.procs:
            proc.stop()
        self.procs = []
