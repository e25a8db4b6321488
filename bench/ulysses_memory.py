"""Per-rank activation memory of one micro-batch with Ulysses sequence parallelism: the FSDP2 engine's update
(forward + backward) on 2 gloo ranks, sp=1 (each rank runs the whole micro-batch) against sp=2 (the two ranks share
it, each holding half of its packed tokens), the same micro-batch of long sequences. torch's MemTracker counts the
real tensors by category; `act` is what the forward keeps for backward plus the transients, `temp` what backward
allocates. Also the wall time of the update per rank and the share of it the all-to-alls leave.

    python bench/ulysses_memory.py                        # 2 rows x 4096 tokens, a 4-layer hidden-512 Qwen2
    python bench/ulysses_memory.py --rows 1 --tokens 512  # what tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from dist_utils import close_gloo, init_gloo, spawn_ranks  # noqa: E402

GIB = 2 ** 30


def _batch(rows: int, tokens: int, vocab: int):
    from rlcore.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(6, vocab, (rows, tokens), generator=g)
    response = tokens // 2
    mask = torch.ones_like(ids)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(tokens).expand(rows, tokens).clone(),
                                "responses": ids[:, -response:].clone(), "response_mask": mask[:, -response:].clone()})


def _rank(rank, world, port, model_dir, args, out):
    from rlcore.cli.rehearsal import _measure
    from rlcore.engine.base import EngineSpec
    from rlcore.engine.fsdp2 import FSDP2Engine

    init_gloo(rank, world, port)
    torch.set_num_threads(1)
    data = _batch(args.rows, args.tokens, args.vocab)
    results = {}
    for sp in (1, 2):
        engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=True, ulysses_sp=sp,
                                        gradient_checkpointing=args.checkpointing), torch.device("cpu"))

        def update():
            engine.forward_backward([data], lambda o, mb: ((o["log_probs"] * mb.batch["response_mask"]).sum() / mb.batch["response_mask"].sum(), {}))

        update()  # warm-up: first-call allocations are not the step's
        engine.optimizer.zero_grad(set_to_none=True)
        peak = _measure("update", [engine.model], update)
        engine.optimizer.zero_grad(set_to_none=True)
        torch.distributed.barrier()
        start = time.perf_counter()
        for _ in range(args.reps):
            update()
            engine.optimizer.zero_grad(set_to_none=True)
        torch.distributed.barrier()
        results[sp] = (peak.by_kind, (time.perf_counter() - start) / args.reps)
    if rank == 0:
        torch.save(results, out)
    close_gloo()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2, help="sequences in the micro-batch")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per sequence (half of them the response)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    args = parser.parse_args(argv)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=args.tokens, tie_word_embeddings=False)
        Qwen2ForCausalLM(config).save_pretrained(tmp)
        out = os.path.join(tmp, "results.pt")
        spawn_ranks(_rank, 2, lambda port: (2, port, tmp, args, out), fresh=True)  # new processes: their peak memory is measured
        results = torch.load(out)
    print(f"one micro-batch of {args.rows} x {args.tokens} tokens, Qwen2 {args.layers} layers hidden {args.hidden}, "
          f"checkpointing {'on' if args.checkpointing else 'off'}; per rank (rank 0), MemTracker's peak by category:")
    print(f"{'':6}{'act GiB':>10}{'temp GiB':>10}{'act+temp':>10}{'update s':>10}")
    base = None
    for sp, (kinds, seconds) in results.items():
        act, temp = kinds.get("act", 0.0), kinds.get("temp", 0.0)
        base = base or (act + temp, seconds)
        print(f"sp={sp:<3}{act:>10.3f}{temp:>10.3f}{act + temp:>10.3f}{seconds:>10.2f}   "
              f"{(act + temp) / base[0]:.2f}x memory, {seconds / base[1]:.2f}x time of sp=1")


if __name__ == "__main__":
    main()
