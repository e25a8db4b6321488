"""Hybrid-engine weight sync next to a plain memcpy of the same bytes: 2 gloo ranks, FSDP2 -> native rollout.

Each rank times `sync_weights` (gather the FSDP2 shards into full tensors and copy them into its rollout model)
per tensor (bucket 0: one all-gather per tensor) and bucketed (verl's default 2048 MB; the buckets go through
shared memory, the ranks being on one host, and once more over the gloo all-gather), and, in the same
process, one flat all-gather of the model's bytes (the transfer alone) and a memcpy of them. Then the same model
training LoRA adapters (rank --lora_rank on all linear layers): the first sync (every weight, adapted ones merged
as W + scaling * B @ A) and the later ones (adapted weights only). Prints the median over --reps and the ratios
to memcpy.

    .venv/bin/python bench/weight_sync.py        # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.controller.worker import free_port
from rlcore.engine.base import EngineSpec
from rlcore.engine.factory import build_engine
from rlcore.engine.gather import Exchange, all_gather_flat
from rlcore.models.lora import LoraSpec
from rlcore.rollout.factory import build_rollout
from rlcore.rollout.weight_sync import sync_weights

MODES = {"per tensor (bucket 0)": 0, "bucketed (2048 MB)": 2048 * 2**20}  # bucketed: shared memory (one host)


def build_model(path: str, args) -> int:
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, port: int, model_dir: str, args, out: str) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cpu = torch.device("cpu")
    engine = build_engine("fsdp2", EngineSpec(model_path=model_dir, param_dtype="float32", trainable=False), cpu)
    rollout = build_rollout("native", model_path=model_dir, pad_token_id=0, device=cpu)
    results = {mode: _median_seconds(lambda b=bucket: sync_weights(engine, rollout, b), args.reps) for mode, bucket in MODES.items()}
    engine._exchange = Exchange()  # the same buckets over the gloo all-gather instead of shared memory
    results["bucketed, gloo all-gather"] = _median_seconds(lambda: sync_weights(engine, rollout, MODES["bucketed (2048 MB)"]), args.reps)
    nbytes = sum(p.numel() * p.element_size() for p in rollout.model.parameters())
    src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
    # The transfer alone: each rank contributes half of the model's bytes to one flat all-gather (no packing,
    # no copies into the rollout): what any sync over gloo pays at least.
    half = torch.randn(nbytes // 8)
    results["gloo all-gather alone"] = _median_seconds(lambda: all_gather_flat(dst[: 2 * half.numel()], half), args.reps)
    results["memcpy"] = _median_seconds(lambda: dst.copy_(src), args.reps)
    torch.manual_seed(0)
    lora = build_engine("fsdp2", EngineSpec(model_path=model_dir, param_dtype="float32", lora=LoraSpec(args.lora_rank, args.lora_rank)), cpu)
    for label, adapted_only in ((f"LoRA r{args.lora_rank}, all merged", False), (f"LoRA r{args.lora_rank}, adapted only", True)):
        results[label] = _median_seconds(lambda a=adapted_only: sync_weights(lora, rollout, MODES["bucketed (2048 MB)"], a), args.reps)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--lora_rank", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(os.path.join(tmp, "model"), args)
        out = os.path.join(tmp, "out.pt")
        mp.spawn(_rank, args=(free_port(), os.path.join(tmp, "model"), args, out), nprocs=2, join=True)
        results = torch.load(out)
    memcpy = results["memcpy"]
    print(f"Qwen2 {params / 1e6:.1f}M parameters, float32 ({params * 4 / 2**20:.0f} MiB); FSDP2 on 2 gloo ranks x 1 thread -> native "
          f"rollout on each; median of {args.reps}")
    for mode, seconds in results.items():
        print(f"{mode:28s} {seconds * 1e3:8.1f} ms   {seconds / memcpy:5.1f}x memcpy")


if __name__ == "__main__":
    main()
