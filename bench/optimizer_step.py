"""Host seconds of one FSDP2 optimizer step (gradient clipping + AdamW over DTensor parameters) per AdamW kernel.

The model has the Qwen2.5-0.5B shape's 24 layers and 290 parameter tensors but is narrow (hidden 32), so the step's
arithmetic is ~0 and what is timed is the host's work per parameter: DTensor's dispatch and the kernel launches,
which a GPU step pays as well (rlcore.engine.optim.adamw_kernel chooses from these figures). One gloo rank; the
median of --reps steps after two warm-ups.

    .venv/bin/python bench/optimizer_step.py        # ~15 s on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine


def time_steps(engine: FSDP2Engine, reps: int) -> float:
    seconds = []
    for _ in range(reps + 2):
        for p in engine.trained:
            p.grad = torch.ones_like(p)
        start = time.perf_counter()
        engine.optimizer_step()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[2:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--reps", type=int, default=8)
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    try:
        with tempfile.TemporaryDirectory() as model_dir:
            config = Qwen2Config(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=args.layers,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True)
            Qwen2ForCausalLM(config).save_pretrained(model_dir)
            print(f"FSDP2 optimizer step (clip + AdamW), {args.layers} layers, host ms, median of {args.reps}, "
                  f"{torch.get_num_threads()} threads")
            print(f"{'AdamW kernel':30} {'tensors':>7} {'ms':>8}")
            for name, overrides in (("per-parameter loop", {"foreach": False}), ("foreach", {"foreach": True}),
                                    ("fused", {"fused": True}), ("rlcore's default here", {})):
                engine = FSDP2Engine(EngineSpec(model_path=model_dir, lr=1e-3, optimizer_overrides=overrides), torch.device("cpu"))
                print(f"{name:30} {len(engine.trained):7d} {1000 * time_steps(engine, args.reps):8.2f}")
    finally:
        if started_here:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
