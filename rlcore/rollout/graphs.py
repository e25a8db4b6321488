"""The native engine's decode step at fixed shapes, captured in CUDA graphs per bucketed batch size and key length.

A decode step of a 0.5B model is ~700 small kernels; on an H100 launching them from Python costs ~20 ms while the
GPU needs well under 1 ms. A CUDA graph replays the whole step with one launch, but only if the step has the same
shapes and the same buffers every time. So the static step:

- reads its inputs from persistent buffers `[num_slots]` (token, position, start), of which a bucket of size
  B >= rows uses the first B: the running slots are always `[0, rows)` (kv_pool's docstring), and padding rows
  `[rows, B)` are free slots, given token 0 at position 0 from start 0 (one unmasked key, so a finite softmax);
- attends over a fixed key length (masked by start and position): the host's bound of the longest running
  sequence rounded up to a multiple of `kv_block` (at most the pool's `max_len`), so the key length is a bucket too
  and nothing asks the device for it (`int(pos.max())` is a host sync); a graph per (batch, key-length) bucket;
- writes its logits into a persistent output buffer `[num_slots, vocab]`.

Not every bucket earns a capture. A rollout's shrinking tail passes through many buckets for a few steps each: the GPU
bench's rollout (64 prompts x 8 samples x <= 256 tokens over 256 slots, its scheduling replayed on a CPU with a tiny
random model: bench/decode_buckets.py) needs 31 buckets in 355 steps, 20 of them for 8 steps or fewer; and the engine
captures again after every sleep. A capture costs about three eager steps (the warm-up, the recording, the check
below), so about 12 graph steps (an H200 replayed the step 4.19x faster than eager at 256 rows: docs/rollout.md),
while replaying a larger captured bucket wastes at most its padding rows' share of a step. So a step whose bucket has
no graph yet replays the least captured bucket that holds it (as many slots and key positions, or more) until its own
bucket has been needed `capture_after` = 12 steps, and only then captures it: a bucket's padding never costs more than
about one capture (the rent-or-buy rule, at most twice the best choice in hindsight). A step that no captured bucket
holds captures its own at once. That replay of the bench's rollout captures 8 buckets instead of 31 (7 instead of 45
over 512 slots).

A captured graph holds the addresses of the pool and of the weights. Weight updates copy into the same storage, so
the graphs stay valid across them, and an engine that never sleeps captures each bucket once. sleep() frees the
pool (and at level 2 the weights): `release()` drops the graphs with their private memory pool and static buffers,
and they are captured again on first use after the wake-up; so is a pool allocated anew in another shape. Safety
net: the first replay of every capture is compared with the eager decode; a capture that raises or a replay that
differs makes the engine warn once and decode eagerly from then on.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import torch

from rlcore.rollout.kv_pool import KVPool, SlotCache, decode_mask


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's spacing: 1, 2, 4, then every 8 up to `max_num_seqs` (which is always one)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def replay_tolerance(dtype: torch.dtype) -> float:
    """Largest |replay - eager| / max(1, |eager|) accepted at the first replay: the static step sums attention over
    more (masked, zero-weight) keys, so half precision rounds differently; a wrong graph is off by O(1)."""
    return 1e-3 if dtype == torch.float32 else 5e-2


class DecodeGraphs:
    """`decode(token, pos, kv_len, eager)` -> logits `[rows, vocab]` of one static decode step, or None when no bucket holds
    `rows` (the caller then decodes eagerly). `capture=False` runs the static step eagerly (CPU: graphs are
    CUDA-only, but the static maths and the bookkeeping are the same and tested there)."""

    def __init__(self, decoder: Callable, pool: KVPool, vocab_size: int, sizes: list[int], capture: bool, kv_block: int = 256,
                 capture_after: int = 12) -> None:
        self.decoder, self.pool, self.vocab_size, self.kv_block = decoder, pool, vocab_size, kv_block
        self.capture_after = capture_after  # steps a bucket is needed, riding a larger captured one, before its own capture
        self.sizes, self.capture = sorted(set(sizes)), capture
        self.disabled = False  # set once, by the safety net: this engine decodes eagerly from then on
        self.verified: set[tuple[int, int]] = set()  # buckets whose current graph's replay matched the eager decode
        self.check_first_replay = True  # tests turn it off to see every step take the static path
        self.graphs: dict[tuple[int, int], Callable[[], None]] = {}  # (batch, key length) bucket -> replay
        self.num_captures = 0  # over the engine's life: a rollout's share shows what re-capturing costs
        self.capture_seconds = 0.0  # over the engine's life: host seconds capturing and checking (the check waits for the device)
        self.needed: dict[tuple[int, int], int] = {}  # uncaptured bucket -> steps it was needed since the graphs were last dropped
        self._pool_key: tuple | None = None
        self._mempool = None  # one private memory pool shared by every bucket's graph (they never run at once)
        self._stream = None  # the side stream graphs are captured on

    def bucket(self, rows: int) -> int | None:
        """The smallest size >= rows; sizes above the pool are clamped to it (a pool of 100 slots has a bucket 100)."""
        fits = [min(s, self.pool.num_slots) for s in self.sizes if min(s, self.pool.num_slots) >= rows]
        return min(fits) if fits else None

    def kv_bucket(self, kv_len: int) -> int:
        return min(-(-kv_len // self.kv_block) * self.kv_block, self.pool.max_len)

    def decode(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int, eager: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """`kv_len`: a bound the caller knows without a sync, > every row's position."""
        rows = len(token)
        size = None if self.disabled else self.bucket(rows)
        if size is None:
            return None
        self._follow_pool()
        key = self._replayed((size, self.kv_bucket(kv_len)))
        self._fill_inputs(token, pos, key[0])
        if key not in self.graphs:
            started = time.perf_counter()
            try:
                self.graphs[key] = self._capture(*key)
                self.num_captures += 1
            except Exception as err:  # noqa: BLE001 - any capture failure means: decode eagerly, loudly
                return self._give_up(f"capturing the decode step for batch {key[0]} raised {type(err).__name__}: {err}", eager)
            finally:
                self.capture_seconds += time.perf_counter() - started
        if key in self.verified or not self.check_first_replay:
            self.graphs[key]()
            return self.out[:rows]  # overwritten by the next step: sampling consumes it first
        return self._verify(key, rows, eager)

    def _replayed(self, key: tuple[int, int]) -> tuple[int, int]:
        """The bucket a step of bucket `key` replays (the module's docstring says why): its own once captured; else
        the least captured bucket holding it, until `key` has been needed `capture_after` steps; else `key`."""
        if key in self.graphs:
            return key
        self.needed[key] = needed = self.needed.get(key, 0) + 1
        holders = [k for k in self.graphs if k[0] >= key[0] and k[1] >= key[1]]
        if holders and needed < self.capture_after:
            return min(holders, key=lambda k: (k[0] * k[1], k))
        return key

    def _verify(self, key: tuple[int, int], rows: int, eager: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """First replay of a bucket against the eager decode of the same step; the eager logits are returned (its
        KV write, the same step's, comes last)."""
        started = time.perf_counter()
        self.graphs[key]()
        replayed = self.out[:rows].float().clone()
        expected = eager()
        error = float((replayed - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1.0))
        self.capture_seconds += time.perf_counter() - started
        if not error <= replay_tolerance(expected.dtype):  # `not <=`: a NaN error fails too
            self._give_up(f"the decode step for batch {key[0]} differs from the eager decode by {error:.2e} (relative)", None)
        else:
            self.verified.add(key)
        return expected

    def _give_up(self, why: str, eager: Callable[[], torch.Tensor] | None) -> torch.Tensor | None:
        warnings.warn(f"native rollout: {why}; decoding eagerly from now on (set actor_rollout_ref.rollout.enforce_eager=True "
                      f"to skip the capture)", RuntimeWarning, stacklevel=3)
        self.disabled, self.graphs, self.needed = True, {}, {}
        return None if eager is None else eager()

    def _follow_pool(self) -> None:
        """Drops the graphs and re-allocates the static buffers when the pool is not the one they were made for."""
        pool = self.pool
        key = (pool.num_slots, pool.max_len, tuple(t.data_ptr() for t in (*pool.keys, *pool.values)))
        if key == self._pool_key:
            return
        self.graphs, self.verified, self.needed, self._pool_key = {}, set(), {}, key
        slots, device = pool.num_slots, pool.device
        self.token, self.pos, self.start = (torch.zeros(slots, dtype=torch.long, device=device) for _ in range(3))
        self.out = torch.zeros(slots, self.vocab_size, dtype=pool.geometry.dtype, device=device)

    def release(self) -> None:
        """Drops every graph, their memory pool and the static buffers (the engine's sleep: what they point at is
        freed); the next decode captures again, each bucket checked against the eager decode again."""
        self.graphs, self.verified, self.needed, self._pool_key, self._mempool = {}, set(), {}, None, None
        self.token = self.pos = self.start = self.out = None

    def _fill_inputs(self, token: torch.Tensor, pos: torch.Tensor, size: int) -> None:
        """Device-to-device copies into the static inputs; padding rows get token 0 at position 0 from start 0."""
        rows = len(token)
        for buffer, value in ((self.token, token), (self.pos, pos), (self.start, self.pool.start[:rows])):
            buffer[:rows].copy_(value)
            buffer[rows:size].zero_()

    def _step(self, size: int, kv_len: int) -> None:
        """The static decode step over slots `[0, size)` and key positions `[0, kv_len)`: every shape is fixed."""
        token, pos, start = self.token[:size], self.pos[:size], self.start[:size]
        cache = SlotCache(self.pool, 0, size, positions=pos, kv_len=kv_len)
        self.out[:size].copy_(self.decoder(token[:, None], (pos - start)[:, None], decode_mask(start, pos, kv_len), cache))

    def _capture(self, size: int, kv_len: int) -> Callable[[], None]:
        """A replay function for bucket (size, kv_len): the captured graph's, or (capture=False) the static step."""
        if not self.capture:
            return lambda: self._step(size, kv_len)
        # Captures run on one side stream (capture is not allowed on the default stream); warm-up on it first, as
        # torch's recipe says: lazy initialisations (cuBLAS workspaces) must not happen inside the capture. The warm-up
        # is a full decode step of the current inputs; the replay repeats it.
        device = self.pool.device
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        if self._stream is None:  # kept across release(): cuBLAS keeps a workspace per stream for the process's life
            self._stream = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        self._stream.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._stream):
            self._step(size, kv_len)
            # capture_begin/end rather than the torch.cuda.graph context, which empties the allocator's cache at every
            # capture (cached blocks go back to the driver, to be cudaMalloc'ed again): ~35 buckets, captured again
            # whenever the pool is new.
            torch.cuda.synchronize(device)  # as torch.cuda.graph does: nothing of the warm-up still in flight
            graph.capture_begin(pool=self._mempool)
            try:
                self._step(size, kv_len)
            finally:
                graph.capture_end()
        current.wait_stream(self._stream)
        return graph.replay
