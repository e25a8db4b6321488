"""Helpers for tests that run N gloo ranks in spawned processes (importable by the children via sys.path)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from rlcore.controller.worker import free_port  # noqa: F401  (re-exported for the tests)
from rlcore.models.logits import entropy_from_logits, gather_log_probs
from rlcore.protocol import position_ids_from_mask


def init_gloo(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))


def spawn_ranks(fn, nprocs: int, args_for_port, fresh: bool = False) -> None:
    """`mp.spawn(fn, args_for_port(port), nprocs)` on a fresh port, in the pytest run's warm rank processes
    (tests/rank_pool.py), or in new ones if `fresh` (what measures a process's memory, or patches its modules). A rank
    killed by a signal (a C++ abort in gloo's transport threads, not a Python error) is retried once on a new port,
    loudly: CI saw it once, on a machine where it never reproduced. A Python exception, or a second abort, fails the
    test."""
    import sys

    import torch.multiprocessing as mp
    from rank_pool import run_ranks

    for attempt in (1, 2):
        try:
            if fresh:
                mp.spawn(fn, args=args_for_port(free_port()), nprocs=nprocs, join=True)
            else:
                run_ranks(fn, nprocs, args_for_port(free_port()))
            return
        except mp.ProcessExitedException as e:
            if attempt == 2 or e.signal_name is None:
                raise
            print(f"spawn_ranks: {e}; retrying once on a new port", file=sys.stderr)


def close_gloo() -> None:
    """Waits for every rank, then tears the group down. Without the barrier a rank that finishes first closes its
    gloo pairs while a peer is still writing its result, and the peer aborts (SIGABRT), seen once in CI."""
    dist.barrier()
    dist.destroy_process_group()


def make_rollout_batch(num_rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch in the trainer's layout with uneven left-padded prompts and uneven right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    prompt_mask = torch.ones(num_rows, prompt_len, dtype=torch.long)
    response_mask = torch.zeros(num_rows, response_len, dtype=torch.long)
    for i in range(num_rows):
        prompt_mask[i, : int(torch.randint(0, prompt_len - 1, (1,), generator=g))] = 0
        response_mask[i, : int(torch.randint(1, response_len + 1, (1,), generator=g))] = 1
    prompts = torch.randint(6, vocab, (num_rows, prompt_len), generator=g) * prompt_mask
    responses = torch.randint(6, vocab, (num_rows, response_len), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], -1)
    return {
        "input_ids": torch.cat([prompts, responses], -1), "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask), "responses": responses, "response_mask": response_mask,
        "old_log_probs": -torch.rand(num_rows, response_len, generator=g) * 3,
        "advantages": torch.randn(num_rows, 1, generator=g).expand(num_rows, response_len) * response_mask,
        "ref_log_prob": -torch.rand(num_rows, response_len, generator=g) * 3,
    }


def token_outputs(logits: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]:
    """What an engine hands a loss, computed the plain way from response-aligned logits `[batch, len, vocab]`; and
    sum_v p(v)^2 (asked for by TokenRequest.sum_pi_squared) as verl computes it, exp(logsumexp(2z) - 2 logsumexp(z))."""
    z = logits.float()
    return {"log_probs": gather_log_probs(z, responses), "entropy": entropy_from_logits(z),
            "sum_pi_squared": torch.exp(torch.logsumexp(2.0 * z, -1) - 2.0 * torch.logsumexp(z, -1))}


def assert_split_invariant(engine, micro_batch_sets, loss_fn, loss_key: str) -> None:
    """Each set of micro-batches (the same rows, split differently) gives the first set's loss and gradients."""
    import pytest

    results = []
    for parts in micro_batch_sets:
        loss = sum(m[loss_key] for m in engine.forward_backward(parts, loss_fn))
        results.append((loss, [p.grad.full_tensor().clone() for p in engine.model.parameters()]))
        engine.optimizer.zero_grad(set_to_none=True)
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        for g, r in zip(grads, results[0][1]):
            torch.testing.assert_close(g, r, atol=1e-7, rtol=1e-5)


def split_rows(data, sizes: list[int]):
    """Consecutive micro-batches of the given row counts."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [data.index(list(range(s, s + n))) for s, n in zip(starts, sizes)]
