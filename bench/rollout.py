"""The native rollout engine against Hugging Face `generate`: same model, same prompts, same sampling, one run.

The model and prompts are grpo_arith_cpu_v1's (bench/vs_trl): 16 prompts x 4 samples = 64 sequences per call,
temperature 1, no top-k/top-p, up to --max_tokens tokens. Lengths: "skewed" stops at any of --stop_tokens token
ids (about 4% of a random model's mass each step: most responses end early, a few run to the limit, as RL
batches do); "uniform" never stops early (every sequence runs to the limit). Prints generated tokens/s (tokens up
to and including the stop token) as the median over --reps calls, and the ratio.

    .venv/bin/python bench/rollout.py        # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vs_trl"))
from assets import build_assets  # noqa: E402

from rlcore.rollout.base import SamplingParams  # noqa: E402
from rlcore.rollout.native import NativeRollout  # noqa: E402


def batch(assets: str, prompts: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(assets, "tokenizer"))
    texts = [json.loads(line)["prompt"] for line in open(os.path.join(assets, "prompts.jsonl"))][:prompts]
    enc = tokenizer([t for t in texts for _ in range(n)], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def generated_tokens(responses: torch.Tensor, stop: list[int], pad: int) -> int:
    """Tokens up to and including the first stop token of each row (padding after it excluded)."""
    total = 0
    for row in responses.tolist():
        hits = [i for i, t in enumerate(row) if t in stop]
        total += hits[0] + 1 if hits else sum(1 for t in row if t != pad) if pad not in stop else len(row)
    return total


def length_cases(args, model, ids: torch.Tensor, mask: torch.Tensor):
    """(case, the engines' SamplingParams, an HF generate call returning its generated tokens) per length case."""
    for case, stop in (("skewed", list(range(4, 4 + args.stop_tokens))), ("uniform", [])):
        sp = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, top_k=-1, top_p=1.0, stop_token_ids=stop)
        gen_kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_tokens, pad_token_id=0,
                          eos_token_id=stop or None, min_new_tokens=0 if stop else args.max_tokens)

        def hf(gen_kwargs=gen_kwargs, stop=stop) -> int:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)[:, ids.shape[1]:]
            return generated_tokens(out, stop, 0) if stop else out.numel()

        yield case, sp, hf


def time_calls(fn, reps: int) -> tuple[float, int]:
    fn()  # warm-up
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        tokens = fn()
        runs.append((time.perf_counter() - start, tokens))
    seconds = statistics.median(s for s, _ in runs)
    return seconds, statistics.median(t for _, t in runs)


def length_case_parser(description: str) -> argparse.ArgumentParser:
    """The batch and length-case arguments every rollout bench takes (this one and rollout_vllm.py)."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--stop_tokens", type=int, default=4, help="how many token ids end a sequence (skewed case)")
    parser.add_argument("--reps", type=int, default=5)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = length_case_parser(__doc__).parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as assets:
        build_assets(assets)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(assets, "model"), dtype=torch.float32).eval()
        native = NativeRollout(os.path.join(assets, "model"), pad_token_id=0, device=torch.device("cpu"), seed=0)  # its own copy
        native.update_weights(model.state_dict().items())
        ids, mask = batch(assets, args.prompts, args.n)
    print(f"{ids.shape[0]} sequences ({args.prompts} prompts x {args.n}), <= {args.max_tokens} tokens, temperature 1, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Qwen2, fp32, {torch.get_num_threads()} threads; "
          f"median of {args.reps}")
    print(f"{'case':10s} {'mean length':>11s} {'HF generate tok/s':>18s} {'native tok/s':>13s} {'ratio':>6s}")
    for case, sp, hf in length_cases(args, model, ids, mask):
        def ours() -> int:
            return int(native.generate(ids, mask, sp).response_mask.sum())

        hf_s, hf_tokens = time_calls(hf, args.reps)
        our_s, our_tokens = time_calls(ours, args.reps)
        print(f"{case:10s} {our_tokens / ids.shape[0]:11.1f} {hf_tokens / hf_s:18.0f} {our_tokens / our_s:13.0f} "
              f"{(our_tokens / our_s) / (hf_tokens / hf_s):5.2f}x")


if __name__ == "__main__":
    main()
