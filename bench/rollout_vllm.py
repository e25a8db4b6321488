"""vLLM's CPU engine (through rlcore's adapter) against the native engine and Hugging Face `generate`, plus the weight
push into each engine against a plain memcpy of the same tensors. Same model, prompts and sampling as bench/rollout.py
(grpo_arith_cpu_v1's 2.6M-parameter Qwen2, 16 prompts x 4 samples, temperature 1), one run.

Needs vLLM: run it with the vLLM venv (`make vllm-env`):

    PYTHONPATH=$PWD .cache/vllm_venv/bin/python bench/rollout_vllm.py        # ~2 min on 2 cores
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout import batch, build_assets, length_case_parser, length_cases, time_calls  # noqa: E402  (bench/rollout.py's helpers)

from rlcore.rollout.factory import build_rollout  # noqa: E402
from rlcore.rollout.native import NativeRollout  # noqa: E402


def time_push(push, reps: int) -> float:
    """Median seconds of `push()` over reps (after one warm-up)."""
    push()
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        push()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = length_case_parser(__doc__)
    parser.add_argument("--no_enforce_eager", action="store_true", help="let vLLM compile (CPU: torch.compile via inductor)")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as assets:
        build_assets(assets)
        model_dir = os.path.join(assets, "model")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        weights = dict(model.state_dict())
        native = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), seed=0)
        start = time.perf_counter()
        vllm = build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=torch.device("cpu"), dtype="float32", seed=0,
                             max_model_len=256, max_num_seqs=args.prompts * args.n, enforce_eager=not args.no_enforce_eager)
        build_s = time.perf_counter() - start
        torch.set_num_threads(min(2, os.cpu_count() or 1))  # the adapter restored set_num_threads after vLLM's init
        ids, mask = batch(assets, args.prompts, args.n)
        # Weight push: the whole model per call, as sync_weights sends it.
        copies = {k: torch.empty_like(v) for k, v in weights.items()}
        memcpy_s = time_push(lambda: [copies[k].copy_(v) for k, v in weights.items()], args.reps)
        native_s = time_push(lambda: native.update_weights(weights.items()), args.reps)
        vllm_s = time_push(lambda: vllm.update_weights(weights.items()), args.reps)
    megabytes = sum(v.numel() * v.element_size() for v in weights.values()) / 2**20
    print(f"{ids.shape[0]} sequences ({args.prompts} prompts x {args.n}), <= {args.max_tokens} tokens, temperature 1, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Qwen2, fp32, {torch.get_num_threads()} threads; "
          f"median of {args.reps}; vLLM engine built in {build_s:.1f} s (enforce_eager={not args.no_enforce_eager})")
    print(f"{'case':10s} {'mean length':>11s} {'HF generate tok/s':>18s} {'native tok/s':>13s} {'vLLM tok/s':>11s} "
          f"{'vLLM/HF':>8s} {'vLLM/native':>12s}")
    for case, sp, hf in length_cases(args, model, ids, mask):
        rates = []
        for fn in (hf, lambda: int(native.generate(ids, mask, sp).response_mask.sum()),
                   lambda: int(vllm.generate(ids, mask, sp).response_mask.sum())):
            seconds, tokens = time_calls(fn, args.reps)
            rates.append((tokens / seconds, tokens))
        (hf_rate, _), (native_rate, _), (vllm_rate, vllm_tokens) = rates
        print(f"{case:10s} {vllm_tokens / ids.shape[0]:11.1f} {hf_rate:18.0f} {native_rate:13.0f} {vllm_rate:11.0f} "
              f"{vllm_rate / hf_rate:7.2f}x {vllm_rate / native_rate:11.2f}x")
    print(f"weight push of {megabytes:.1f} MiB ({len(weights)} tensors): memcpy {memcpy_s * 1e3:.1f} ms, native "
          f"{native_s * 1e3:.1f} ms ({native_s / memcpy_s:.1f}x), vLLM reload_weights {vllm_s * 1e3:.1f} ms ({vllm_s / memcpy_s:.1f}x)")


if __name__ == "__main__":
    main()
