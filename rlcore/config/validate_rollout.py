"""Rules for the native rollout engine's scheduler and KV pool (`actor_rollout_ref.rollout.max_num_seqs`,
`max_num_batched_tokens`, `engine_kwargs.native.*`). `c` is validate's checker (get / error / at_least)."""

from __future__ import annotations

ROLLOUT = "actor_rollout_ref.rollout"
NATIVE_KWARGS = {"kv_cache_memory_bytes": "KV pool budget in bytes (default: gpu_memory_utilization on CUDA, none on CPU)"}


def check_native_rollout(c) -> None:
    seqs_ok = c.at_least(f"{ROLLOUT}.max_num_seqs", 1, fix=256)
    c.at_least(f"{ROLLOUT}.max_num_batched_tokens", 1, fix=8192)
    native = c.get(f"{ROLLOUT}.engine_kwargs.native") or {}
    for key in sorted(set(native) - set(NATIVE_KWARGS)):
        known = "; ".join(f"{k}: {v}" for k, v in NATIVE_KWARGS.items())
        c.error(f"{ROLLOUT}.engine_kwargs.native.{key} is not an argument of the native rollout engine; known: {known}")
    budget = native.get("kv_cache_memory_bytes")
    if budget is not None and (not isinstance(budget, int) or budget <= 0):
        c.error(f"{ROLLOUT}.engine_kwargs.native.kv_cache_memory_bytes={budget!r} must be a positive byte count; "
                f"use e.g. +{ROLLOUT}.engine_kwargs.native.kv_cache_memory_bytes={2**30}")
    _check_capture_sizes(c)
    if seqs_ok and c.get(f"{ROLLOUT}.name") in ("native", "hf"):
        n, seqs = c.get(f"{ROLLOUT}.n"), c.get(f"{ROLLOUT}.max_num_seqs")
        if seqs < n:  # the native engine admits a prompt's samples together, so they share its prefill
            c.error(f"{ROLLOUT}.max_num_seqs={seqs} is fewer than {ROLLOUT}.n={n}: the native engine decodes a prompt's "
                    f"n samples together; use {ROLLOUT}.max_num_seqs={max(n, 256)}")


def _check_capture_sizes(c) -> None:
    """verl's `cudagraph_capture_sizes`: null (the engine's default buckets) or a list of positive batch sizes."""
    key = f"{ROLLOUT}.cudagraph_capture_sizes"
    sizes = c.get(key)
    if sizes is None:
        return
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s <= 0]
    if bad or not len(sizes):
        c.error(f"{key}={list(sizes)} must be a non-empty list of positive batch sizes (bad: {bad}); "
                f"use e.g. {key}=[1,2,4,8,16,32,64] or null for 1, 2, 4, 8, 16, ... up to max_num_seqs")
