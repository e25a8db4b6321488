"""Which decode-graph buckets one rollout needs, and how many the native engine captures (rollout/graphs.py).

On a GPU the native engine replays its decode step as CUDA graphs, one per (batch, key length) bucket, captured
again after every sleep; each capture costs about three eager steps. This replays a rollout's scheduling on the CPU
(the static step runs eagerly there, with the same buckets and bookkeeping) and counts, per slot count and
`capture_after`: the decode steps, the buckets they needed, the captures, and the padding rows the steps that rode
a larger captured bucket decoded. The default shape is the GPU bench's rollout (bench/gpu_step.py: 64 prompts x
8 samples x <= 256 tokens): a tiny random Qwen2 over 99 tokens with one stop token, whose mean length (~90) is near
the 0.5B random model's on the H200 (108.7).

    .venv/bin/python bench/decode_buckets.py        # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.rollout.base import SamplingParams
from rlcore.rollout.graphs import DecodeGraphs, default_capture_sizes
from rlcore.rollout.native import NativeRollout


def replay(model_dir: str, ids: torch.Tensor, sampling: SamplingParams, slots: int, capture_after: int) -> dict:
    engine = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), max_num_seqs=slots)
    engine.finish_check_every = 4  # as on CUDA: the batch shrinks at every fourth step
    graphs = engine.graphs = DecodeGraphs(engine.decoder, engine.pool, engine.model.config.vocab_size,
                                          default_capture_sizes(slots), capture=False, capture_after=capture_after)
    graphs.check_first_replay = False  # CPU: the static step is the eager one
    needed, steps, padding, choose, fill = set(), [0], [0], graphs._replayed, graphs._fill_inputs

    def replayed(key):
        needed.add(key)
        steps[0] += 1
        return choose(key)

    def fill_inputs(token, pos, size):
        padding[0] += size - len(token)
        fill(token, pos, size)

    graphs._replayed, graphs._fill_inputs = replayed, fill_inputs
    out = engine.generate(ids, torch.ones_like(ids), sampling)
    return {"steps": steps[0], "buckets": len(needed), "captures": engine.stats["graph_captures"],
            "padding": padding[0], "prefills": engine.stats["prefills"], "mean_length": float(out.response_mask.sum(-1).float().mean())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=256)
    p.add_argument("--slots", default="256,512", help="max_num_seqs values")
    p.add_argument("--capture_after", default="1,12", help="1: every bucket captured at first use (the rule before)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=99, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)
    ids = torch.randint(5, 99, (args.prompts, 24), generator=torch.Generator().manual_seed(1)).repeat_interleave(args.n, 0)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop_token_ids=[3], seed=0)
    with tempfile.TemporaryDirectory() as model_dir:
        Qwen2ForCausalLM(config).save_pretrained(model_dir)
        print(f"{args.prompts} prompts x {args.n} samples x <= {args.max_tokens} tokens, a tiny random Qwen2, one stop token")
        print(f"{'slots':>5} {'capture_after':>13} {'mean length':>11} {'prefills':>8} {'steps':>5} {'buckets':>7} {'captures':>8} {'padding rows':>12}")
        for slots in (int(s) for s in args.slots.split(",")):
            for after in (int(a) for a in args.capture_after.split(",")):
                r = replay(model_dir, ids, sampling, slots, after)
                print(f"{slots:5d} {after:13d} {r['mean_length']:11.1f} {r['prefills']:8d} {r['steps']:5d} {r['buckets']:7d} "
                      f"{r['captures']:8d} {r['padding']:12d}")


if __name__ == "__main__":
    main()
