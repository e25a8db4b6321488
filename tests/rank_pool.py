"""Warm rank processes for the tests that run N gloo ranks (tests/dist_utils.spawn_ranks).

A spawned rank pays for a Python start and the imports of torch, transformers and rlcore (~5 s of a 2-core CPU)
before its test's work; about 25 test modules spawn ranks. The pool keeps N processes per world size for the pytest run
and hands each test's function to them, as `mp.spawn(fn, args, nprocs)` would run it: `fn(rank, *args)` in every
process at once, the first error (a raised exception, or a rank killed by a signal) failing the call the same way.

A process serves the next test only if the test left it as a fresh one would be: no process group, no megatron-core
parallel state, no vLLM engine ever built in it; after each function its environment variables, torch's default
dtype, grad mode, thread count and default generator's seed (a fresh process's) are put back. A rank that raised, died or left
state behind ends the whole pool (its peers may be blocked in a collective with it): the next call starts fresh
processes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from multiprocessing.connection import wait

import torch.multiprocessing as mp
from proc_utils import KEPT

FRESH_SEED = 67280421310721  # torch's default generator seed in a new process


def _serve(rank: int, conn) -> None:
    import torch
    import torch.distributed as dist

    environ, threads = dict(os.environ), torch.get_num_threads()
    while True:
        try:
            fn, args, path = conn.recv()
        except EOFError:
            return
        sys.path[:] = path  # where the test's module is found, as pytest set it up
        torch.manual_seed(FRESH_SEED)
        try:
            fn(rank, *args)
            error = None
        except BaseException:  # noqa: BLE001 -- sent back to the test, as mp.spawn does
            error = traceback.format_exc()
        mpu = sys.modules.get("megatron.core.parallel_state")
        # (vLLM's distributed and compilation state outlive its engine: one engine per process)
        dirty = dist.is_initialized() or (mpu is not None and mpu.model_parallel_is_initialized()) or "vllm" in sys.modules
        os.environ.clear()
        os.environ.update(environ)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.set_num_threads(threads)
        conn.send((error, dirty))


class RankPool:
    def __init__(self, nprocs: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(nprocs):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
            KEPT.add(proc.pid)

    def run(self, fn, args: tuple) -> bool:
        """Runs fn(rank, *args) on every rank; raises as mp.spawn would. Returns whether the pool may be reused."""
        for conn in self.conns:
            conn.send((fn, args, list(sys.path)))
        waiting = dict(enumerate(self.conns))
        clean = True
        while waiting:
            sentinels = {self.procs[rank].sentinel: rank for rank in waiting}
            for ready in wait(list(waiting.values()) + list(sentinels)):
                rank = sentinels.get(ready, next((r for r, conn in waiting.items() if conn is ready), None))
                if rank not in waiting:
                    continue
                try:
                    error, dirty = waiting.pop(rank).recv() if waiting[rank].poll() else self._died(rank)
                except EOFError:
                    self._died(rank)
                clean = clean and not dirty
                if error is not None:
                    pid = self.procs[rank].pid
                    self.close()
                    raise mp.ProcessRaisedException(f"\n\n-- Process {rank} terminated with the following error:\n{error}", rank, pid)
        return clean

    def _died(self, rank: int):
        """A rank's process ended without an answer (a signal, os._exit): the call fails as mp.spawn's would."""
        proc = self.procs[rank]
        proc.join(timeout=10)
        code, pid = proc.exitcode, proc.pid
        self.close()
        name = signal.Signals(-code).name if code is not None and code < 0 else None
        raise mp.ProcessExitedException(f"process {rank} terminated with {'signal ' + name if name else f'exit code {code}'}",
                                        error_index=rank, error_pid=pid, exit_code=code, signal_name=name)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.kill()
            proc.join(timeout=10)
            KEPT.discard(proc.pid)
        self.conns, self.procs = [], []


_POOLS: dict[int, RankPool] = {}
COUNTS = {"calls": 0, "processes started": 0}  # the session's account (tests/conftest.py prints it)


def run_ranks(fn, nprocs: int, args: tuple) -> None:
    """`mp.spawn(fn, args, nprocs, join=True)` on the warm processes of world size `nprocs`."""
    pool = _POOLS.pop(nprocs, None)
    if pool is None:
        pool = RankPool(nprocs)
        COUNTS["processes started"] += nprocs
    COUNTS["calls"] += 1
    if pool.run(fn, args):
        _POOLS[nprocs] = pool
    else:
        pool.close()


def close_all() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
