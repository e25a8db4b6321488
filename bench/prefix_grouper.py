"""The prefix grouper (actor.use_prefix_grouper) against plain packing, on a GRPO-shaped batch: long shared prompts,
n samples each, short responses (where it pays: each prompt's forward and backward run once instead of n times).

Times compute_log_prob (old log-probs) and one forward_backward (the update's) on one FSDP2 rank for both engines,
alternating, and prints seconds per pass and the ratio plain / grouped; the grouped log-probs are checked against
the plain ones in the same run. Usage:

    .venv/bin/python bench/prefix_grouper.py                 # ~1 min on 2 cores
    .venv/bin/python bench/prefix_grouper.py --prompt 1024 --n 16
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.controller.worker import free_port
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec, FSDPSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.hf import quiet_transformers
from rlcore.protocol import DataProto, position_ids_from_mask
from rlcore.workers.actor import compute_log_prob


def grpo_batch(args) -> DataProto:
    """`--prompts` prompts of `--prompt` tokens, each repeated n times, with responses of 1..`--response` tokens."""
    g = torch.Generator().manual_seed(0)
    rows = args.prompts * args.n
    prompts = torch.randint(10, args.vocab, (args.prompts, args.prompt), generator=g).repeat_interleave(args.n, 0)
    lengths = torch.randint(1, args.response + 1, (rows,), generator=g)
    response_mask = (torch.arange(args.response)[None] < lengths[:, None]).long()
    responses = torch.randint(10, args.vocab, (rows, args.response), generator=g) * response_mask
    attention_mask = torch.cat([torch.ones(rows, args.prompt, dtype=torch.long), response_mask], -1)
    return DataProto.from_dict({"input_ids": torch.cat([prompts, responses], -1), "attention_mask": attention_mask,
                                "position_ids": position_ids_from_mask(attention_mask), "responses": responses,
                                "response_mask": response_mask})


def nll(outputs, mb):
    mask = mb.batch["response_mask"]
    return -(outputs["log_probs"] * mask).sum() / mask.sum(), {}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    quiet_transformers()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(minutes=5))
    with tempfile.TemporaryDirectory() as tmp:
        config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                             num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                             num_key_value_heads=args.hidden // 64, max_position_embeddings=args.prompt + args.response)
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(tmp)
        engines = {name: FSDP2Engine(EngineSpec(model_path=tmp, use_remove_padding=True, fsdp=FSDPSpec(prefix_grouper=name == "grouped"), lr=1e-4),
                                     torch.device("cpu")) for name in ("plain", "grouped")}
    data, micro = grpo_batch(args), MicroBatchSpec(rows=args.n, packed=True)  # a micro-batch holds one prompt's group
    times = {(name, phase): [] for name in engines for phase in ("log_prob", "fwd_bwd")}
    outputs = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            outputs[name] = compute_log_prob(engine, data, micro, temperature=1.0, with_entropy=False).batch["log_probs"]
            times[name, "log_prob"].append(time.perf_counter() - start)
            start = time.perf_counter()
            engine.forward_backward(data.split(args.n), nll)
            engine.optimizer.zero_grad(set_to_none=True)
            times[name, "fwd_bwd"].append(time.perf_counter() - start)
    diff = (outputs["grouped"] - outputs["plain"]).abs().max().item()
    tokens = int(data.batch["attention_mask"].sum())
    print(f"{args.prompts} prompts x n={args.n}, prompt {args.prompt} tokens, responses 1..{args.response} ({tokens} tokens "
          f"packed plainly); model hidden {args.hidden} x {args.layers} layers; max |log-prob diff| {diff:.2e}")
    for phase in ("log_prob", "fwd_bwd"):
        plain, grouped = (min(times[name, phase]) for name in ("plain", "grouped"))
        print(f"{phase:9s} plain {plain:.3f} s  grouped {grouped:.3f} s  speed-up {plain / grouped:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
