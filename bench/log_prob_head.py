"""The log-prob head (rlcore/models/logits.py), what verl's use_torch_compile, entropy_from_logits_with_chunking and
entropy_checkpointing are about, measured in one run:

1. time of forward + backward of log-probs and entropy over `--tokens` tokens, eager against use_torch_compile
   (the chunk's elementwise work fused by torch.compile), on this machine's CPU threads;
2. peak memory of the same at production sizes, on fake tensors (torch's MemTracker): the head as verl computes it
   without those keys (the whole [tokens, vocab] float32 logits, their softmax, kept for backward) against
   rlcore's chunked head (one chunk of logits at a time, recomputed in backward), which needs none of them.

    python bench/log_prob_head.py                                  # 1024 tokens, hidden 896, vocab 32768
    python bench/log_prob_head.py --tokens 256 --vocab 8192 --reps 1   # what tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import time

import torch

GIB = 2 ** 30


def _run(hidden, weight, tokens, compiled: bool) -> None:
    from rlcore.models.logits import token_log_probs

    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    stats = token_log_probs(h, w, tokens, 1.0, with_entropy=True, compiled=compiled)
    (stats.log_probs.sum() + stats.entropy.sum()).backward()


def _full_logits(hidden, weight, tokens) -> None:
    """verl's head without chunking: [tokens, vocab] logits, log-softmax and softmax for the entropy, autograd."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    z = (h @ w.t()).float()
    lp = z.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    ent = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    (lp.sum() + ent.sum()).backward()


def timing(args) -> dict[str, float]:
    from rlcore.models import logits

    threshold, logits.COMPILE_MIN_VOCAB = logits.COMPILE_MIN_VOCAB, min(logits.COMPILE_MIN_VOCAB, args.vocab)
    try:
        return _timing(args)
    finally:
        logits.COMPILE_MIN_VOCAB = threshold


def _timing(args) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=g)
    weight = torch.randn(args.vocab, args.hidden, generator=g) * 0.02
    tokens = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    start = time.perf_counter()
    _run(hidden, weight, tokens, compiled=True)  # the compile, once per process
    out = {"compile_s": time.perf_counter() - start}
    for name, compiled in (("eager", False), ("compiled", True)):
        _run(hidden, weight, tokens, compiled)
        start = time.perf_counter()
        for _ in range(args.reps):
            _run(hidden, weight, tokens, compiled)
        out[name] = (time.perf_counter() - start) / args.reps
    return out


def peak_memory(tokens: int, hidden: int, vocab: int) -> dict[str, float]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rlcore.cli.rehearsal import _measure

    out = {}
    with FakeTensorMode():
        h, w = torch.empty(tokens, hidden, dtype=torch.bfloat16), torch.empty(vocab, hidden, dtype=torch.bfloat16)
        t = torch.zeros(tokens, dtype=torch.long)
        inputs = (h.numel() * 2 + w.numel() * 2 * 2) / GIB  # the hidden states, the weight and its gradient
        for name, work in (("full logits", lambda: _full_logits(h, w, t)), ("rlcore chunked", lambda: _run(h, w, t, False))):
            out[name] = _measure(name, [], work).measured - inputs
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--memory-tokens", type=int, default=8192)
    parser.add_argument("--memory-vocab", type=int, default=151936)  # Qwen2.5 / Qwen3
    args = parser.parse_args(argv)
    t = timing(args)
    threads = torch.get_num_threads()
    print(f"log-prob head, forward + backward with entropy: {args.tokens} tokens x hidden {args.hidden} x vocab {args.vocab}, "
          f"fp32 on {threads} CPU thread(s), {args.reps} rep(s)")
    print(f"  eager (use_torch_compile=False)   {t['eager']:.3f} s")
    print(f"  compiled (use_torch_compile=True) {t['compiled']:.3f} s   eager / compiled = {t['eager'] / t['compiled']:.2f}x "
          f"(compile once per process: {t['compile_s']:.1f} s)")
    m = peak_memory(args.memory_tokens, args.hidden, args.memory_vocab)  # (chunk size as in training: LOGITS_CHUNK_BYTES)
    print(f"peak memory beyond inputs and weight gradient, {args.memory_tokens} tokens x vocab {args.memory_vocab}, bf16 "
          "weights, fake tensors:")
    print(f"  full [tokens, vocab] logits (verl without entropy chunking / checkpointing) {m['full logits']:.2f} GiB")
    print(f"  rlcore's chunked head (always)                                         {m['rlcore chunked']:.2f} GiB   "
          f"full / chunked = {m['full logits'] / max(m['rlcore chunked'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
