"""Calls that cannot take the caller down: a pool of spawned processes, each serving one request at a time over a
pipe, with a per-call time limit; calls that wait are parked, so that waiting calls overlap.

A hung call (a stuck sandbox, an HTTP request without a timeout) can only be stopped from outside its process, so a
call still running `timeout_s` after it started has its process killed while the other processes go on; a call
that takes its process down (os._exit, a signal, a segfault) costs only that call. Reward scorers
(rlcore.reward.isolation) and tools (rlcore.tools.runner) run this way. Processes are spawned, never forked: the
caller runs Ray's threads and torch. A call's time limit starts once its process is set up (it says READY): a
spawned process's imports take seconds, more on a loaded machine, and would otherwise time out its first calls.

Parking. A call still running `suspect_s` after it started is parked: it keeps its process and its whole `timeout_s`
(its result counts if it comes in time), and fresh processes take the next requests. The processes not holding a
parked call may number `num_workers` plus one per parked call (one in its place, one more), so one slow call among
fast ones costs two spare processes; and when no process is computing (each holds a parked call, or was killed)
the pool is only waiting, so every queued request gets a fresh process at once. Either way the calls of a batch
that hangs wait out their time limits side by side, up to the run's cap, instead of queueing behind num_workers
processes. The cap: `max_procs`, and no more processes than requests -- with `max_failures`, than num_workers +
max_failures + 1: the hung calls that end the run plus the processes serving the rest, which also bounds how many
processes a batch of hung calls forks. A run of hung calls thus ends about suspect_s + a process's set-up +
timeout_s after it starts, while the cap holds the calls that end it. After a run the pool is back to num_workers
processes (a process holding a key's state stays until the caller forgets the keys).

Keys. A request's key (a trajectory) ties it to the state its earlier requests left in a process (its tools'
instances): a key's requests run one after another in the process that served the key first, for as long as that
process lives. A parked call's process keeps its keys, so another key's request waits there rather than losing its
state to a fresh process; once the process is killed (its call timed out) or dies, its keys' state is gone and their
requests go to any process. Hung calls of keys that share a process thus end within about two timeouts.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Hashable, Sequence


def call_catching(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """(True, fn's result) or (False, "ExceptionType: message", the exception's last traceback line)."""
    try:
        return True, fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 -- any failure of user code becomes that call's error
        return False, traceback.format_exception_only(type(err), err)[-1].strip()


READY = "ready"  # a process's first message: set up (imports done, tools built), its calls' time limits start now
# How long a process may take to get READY before its call fails: a spawned Python re-imports the caller's main module
# and its own (torch, transformers, Ray's worker) -- seconds, more on a loaded machine -- which must not count
# against a call's timeout_s, yet a process stuck in its set-up must not hang the step either.
STARTUP_TIMEOUT_S = 300.0
# When a running call is suspected of waiting (suspect_s, at most a quarter of timeout_s so that parking comes well
# before the kill): above a rule scorer's milliseconds and a typical sandbox run, so that ordinary calls never spawn
# processes, yet short enough that hung calls are parked, and their fresh processes set up (~0.7 s of CPU each with
# rlcore.train as the main module), within a small fraction of a timeout (60 s for scorers, 30 s for tools).
SUSPECT_S = 2.0
# The most processes a pool holds by default (max_procs): a scoring process spawned by rlcore.train takes ~30 MB,
# so 64 stay under 2 GB; the scorer's defaults (2 workers, max_error_rate 0.1) need 2 + 0.1 n + 1 processes for a
# step whose samples all hang to fail within one timeout plus the ramp, so up to n ~ 600 samples.
MAX_PROCS = 64


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
    or "died" (value None; the process was killed or had died, and is gone from the pool)."""

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

    def parked(self, now: float, suspect_s: float) -> bool:
        """Its call has run suspect_s (a process still setting up is not suspected: its call has not started)."""
        return self.job is not None and self.ready and now - self.started >= suspect_s

    def next_event(self, timeout_s: float, suspect_s: float) -> float:
        """When its call times out, or, before that, gets parked (then a fresh process may take the next request)."""
        if self.ready and not self.parked(time.monotonic(), suspect_s):
            return min(self.started + suspect_s, self.deadline(timeout_s))
        return self.deadline(timeout_s)

    def stop(self) -> None:
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


@dataclass
class _Batch:
    """One `run`: its requests, those not started yet (in order) and how the others ended."""

    requests: Sequence[Any]
    keys: Sequence[Hashable | None]
    limit: int  # failures tolerated: one more stops the run
    cap: int  # the most processes this run may hold
    queue: list[int] = field(init=False)  # requests not started yet, in order
    outcomes: list[Outcome | None] = field(init=False)
    left: int = field(init=False)  # requests not ended yet
    failed: int = 0

    def __post_init__(self) -> None:
        self.queue, self.outcomes, self.left = list(range(len(self.requests))), [None] * len(self.requests), len(self.requests)

    def record(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.left, self.failed = self.left - 1, self.failed + (outcome.status != "ok")


class ProcessPool:
    """`num_workers` processes running `target(conn, *args)` (which calls `serve`); `run` spreads requests over them,
    parking calls that run past `suspect_s` (default: min(SUSPECT_S, timeout_s / 4)) on up to `max_procs` processes
    (default: MAX_PROCS, never fewer than num_workers).

    The processes start on the first `run`; a killed or dead one leaves the pool, and a fresh one takes its place
    (by the end of the run)."""

    def __init__(self, target: Callable[..., None], args: tuple, num_workers: int, timeout_s: float,
                 suspect_s: float | None = None, max_procs: int | None = None) -> None:
        self.target, self.args, self.num_workers, self.timeout_s = target, args, num_workers, timeout_s
        self.suspect_s = min(SUSPECT_S, timeout_s / 4) if suspect_s is None else suspect_s
        self.max_procs = max(num_workers, MAX_PROCS if max_procs is None else max_procs)
        self.procs: list[_Proc] = []
        self.holders: dict[Hashable, _Proc] = {}  # key -> the process holding its state
        self.ctx = multiprocessing.get_context("spawn")

    def run(self, requests: Sequence[Any], keys: Sequence[Hashable | None] | None = None,
            max_failures: int | None = None) -> list[Outcome | None]:
        """One Outcome per request, in request order. `keys[i]`: request i's key (see the module docstring), None: any
        process. With `max_failures`, returns as soon as more than that many calls have failed: the calls still
        running are killed and the requests not run yet are None."""
        while len(self.procs) < self.num_workers:
            self._spawn()
        useful = len(requests) if max_failures is None else min(len(requests), self.num_workers + max_failures + 1)
        batch = _Batch(requests, keys or [None] * len(requests), len(requests) if max_failures is None else max_failures,
                       cap=max(self.num_workers, min(self.max_procs, useful)))
        while batch.left and batch.failed <= batch.limit:
            self._dispatch(batch)
            self._collect(batch)
        for proc in [p for p in self.procs if p.job is not None]:  # stopped early: the calls still running are not waited for
            self._drop(proc)
        self._settle()
        return batch.outcomes

    def _dispatch(self, batch: _Batch) -> None:
        """Starts queued requests: first those whose key's process is free (no other request may take it from them),
        then, in order, those of no held key on a free process or, while the parking rule and the cap allow, a fresh
        one. A key's requests keep their order: the first one pins the key, the next ones wait for its process."""
        for proc in [p for p in self.procs if p.job is None and not p.process.is_alive()]:
            self._drop(proc)  # died since its last call: its keys' state is gone with it
        free = [p for p in self.procs if p.job is None]
        now = time.monotonic()
        waiting_only = all(p.parked(now, self.suspect_s) for p in self.procs)  # (or every process was killed)
        for i in list(batch.queue) if self.holders else []:
            holder = self.holders.get(batch.keys[i])
            if holder is not None and holder in free:
                free.remove(holder)
                self._start(batch, i, holder)
        for i in list(batch.queue):
            if self.holders.get(batch.keys[i]) is not None:
                continue  # its key's process is busy: the request waits for it, with the key's state
            proc = free.pop(0) if free else self._spawn_for(batch, waiting_only)
            if proc is None:  # nothing free and no fresh process allowed: the requests behind this one wait too
                return
            self._start(batch, i, proc)

    def _start(self, batch: _Batch, i: int, proc: _Proc) -> None:
        batch.queue.remove(i)
        if batch.keys[i] is not None:
            self.holders[batch.keys[i]] = proc
        proc.job, proc.started = i, time.monotonic()
        proc.conn.send(batch.requests[i])

    def _spawn_for(self, batch: _Batch, waiting_only: bool) -> _Proc | None:
        """A fresh process for a request no free process can take, if the cap and the parking rule allow one
        (`waiting_only`: no process was computing when this dispatch began)."""
        now = time.monotonic()
        num_parked = sum(p.parked(now, self.suspect_s) for p in self.procs)
        num_serving = len(self.procs) - num_parked  # busy with an unsuspected call, or setting up
        if len(self.procs) >= batch.cap or not (waiting_only or num_serving < self.num_workers + num_parked):
            return None
        return self._spawn()

    def _collect(self, batch: _Batch) -> None:
        """Waits until a call answers, times out, or gets parked; records the calls that ended."""
        busy = [p for p in self.procs if p.job is not None]
        assert busy, "requests left but none running"  # a free process or a fresh one always takes the first request
        until = min(p.next_event(self.timeout_s, self.suspect_s) for p in busy)
        answered = wait([p.conn for p in busy], timeout=max(0.0, until - time.monotonic()))
        for proc in busy:
            if batch.failed > batch.limit:  # the caller gives up: the calls that ended meanwhile change nothing
                return
            outcome = self._outcome(proc, proc.conn in answered)
            if outcome is None:
                continue
            batch.record(proc.job, outcome)
            proc.job = None
            if outcome.status in ("died", "timeout"):
                self._drop(proc)  # the next request it would have served goes to another process or a fresh one

    def _outcome(self, proc: _Proc, answered: bool) -> Outcome | None:
        """How proc's call ended, or None while it runs (or its process just got ready: its call starts now)."""
        if answered:
            try:
                message = proc.conn.recv()
            except (EOFError, OSError):  # the call (or the set-up) took its process down
                return Outcome("died")
            if not proc.ready:  # READY: the call waiting in its pipe starts now
                proc.ready, proc.started = True, time.monotonic()
                return None
            ok, value = message
            return Outcome("ok" if ok else "error", value)
        if time.monotonic() >= proc.deadline(self.timeout_s):
            return Outcome("timeout") if proc.ready else Outcome("died")
        return None

    def _spawn(self) -> _Proc:
        self.procs.append(_Proc(self.ctx, self.target, self.args))
        return self.procs[-1]

    def _drop(self, proc: _Proc) -> None:
        """Stops proc and forgets it; the keys it held are free again (their state is gone)."""
        proc.stop()
        self.procs.remove(proc)
        for key in [k for k, holder in self.holders.items() if holder is proc]:
            del self.holders[key]

    def _settle(self) -> None:
        """Back to num_workers processes between runs: stops the extra ones (the newest first; not those holding a
        key's state) and replaces killed ones, which then set up before the next run needs them."""
        holding = list(self.holders.values())
        for proc in reversed(list(self.procs)):
            if len(self.procs) > self.num_workers and not any(proc is holder for holder in holding):
                self._drop(proc)
        while len(self.procs) < self.num_workers:
            self._spawn()

    def held_keys(self) -> list[Hashable]:
        """The keys whose state lives in a running process."""
        return [key for key, proc in self.holders.items() if proc.process.is_alive()]

    def forget_keys(self) -> None:
        """The caller has released every key's state: keys go to any process again, and the pool shrinks back."""
        self.holders.clear()
        self._settle()

    def close(self) -> None:
        """Stops every process (a later `run` starts fresh ones)."""
        for proc in self.procs:
            proc.stop()
        self.procs, self.holders = [], {}
