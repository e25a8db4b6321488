"""LoRA's weight sync merged against adapter-only (model.lora.merge), FSDP2 -> native rollout, one process.

For each model: one FSDP2 engine training LoRA adapters (all linear layers; after one optimizer step, so B is not
zero) and two rollouts (native, or vLLM: one built with its LoRA support). Timed, median over --reps:
- merged, every weight (the first sync; vLLM's every sync, its sleep having dropped the weights),
- merged, the adapted weights only (the native engine's later syncs; vLLM reloads whole layers),
- unmerged: the base (the first sync) and the adapters alone (every later sync),
- (native) the adapters alone, merged into its weights by the rollout itself (`merge_adapters`),
with the bytes each sends; then the rollout's greedy decode tokens/s over the same prompts with the adapters
applied (unmerged), merged in by the rollout, and with merged weights: the cost of not merging.

    .venv/bin/python bench/lora_sync.py                 # a tiny Qwen2 and Qwen2.5-0.5B's shape
    .venv/bin/python bench/lora_sync.py --models tiny-qwen2   # ~10 s
    .cache/vllm_venv/bin/python bench/lora_sync.py --rollout vllm --models tiny-qwen2   # vLLM's CPU build, one model a run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from rlcore.controller.worker import free_port
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.engine.base import EngineSpec
from rlcore.engine.factory import build_engine
from rlcore.models.lora import LoraSpec
from rlcore.models.random_init import build_model_dir
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.native import NativeRollout
from rlcore.rollout.weight_sync import sync_adapters, sync_weights

MODELS = {  # name: (rlcore.models.random_init shape, overrides of its config, LoRA rank, alpha)
    "tiny-qwen2": ("qwen2.5-0.5b", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2), 16, 32),
    "qwen2.5-0.5b": ("qwen2.5-0.5b", {}, 64, 128),
}


def _median(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _decode_tokens_per_s(rollout: NativeRollout, vocab: int, rows: int, tokens: int) -> float:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (rows, 16), generator=g)
    mask = torch.ones_like(ids)
    sampling = SamplingParams(max_tokens=tokens, do_sample=False)
    rollout.generate(ids, mask, SamplingParams(max_tokens=2, do_sample=False))  # warm-up
    start = time.perf_counter()
    out = rollout.generate(ids, mask, sampling)
    return int(out.response_mask.sum()) / (time.perf_counter() - start)


def _rollout(name: str, model_dir: str, lora_rank: int):
    """The rollout engine, vLLM with its LoRA support when it is to apply adapters (`lora_rank`)."""
    if name == "native":
        return NativeRollout(model_dir, 0, torch.device("cpu"))
    from rlcore.rollout.vllm import VLLMRollout

    return VLLMRollout(model_dir, 0, torch.device("cpu"), dtype="float32", max_model_len=64, max_num_seqs=64, enforce_eager=True,
                       lora_rank=lora_rank)


def one_model(name: str, args, root: str) -> dict:
    shape, overrides, rank, alpha = MODELS[name]
    model_dir = build_model_dir(os.path.join(root, name), shape, build_char_tokenizer(), **overrides)
    torch.manual_seed(0)
    engine = build_engine("fsdp2", EngineSpec(model_path=model_dir, lr=1e-3, lora=LoraSpec(rank, alpha)), torch.device("cpu"))
    rows = torch.randint(10, engine.hf_config.vocab_size, (4, 24))
    from rlcore.protocol import DataProto

    batch = DataProto.from_dict({"input_ids": rows, "attention_mask": torch.ones_like(rows),
                                 "position_ids": torch.arange(24).expand(4, 24), "responses": rows[:, 16:],
                                 "response_mask": torch.ones(4, 8, dtype=torch.long)})
    engine.forward_backward([batch], lambda out, mb: (-out["log_probs"].mean(), {}))
    engine.optimizer_step()  # B moves off zero: the adapters change what the rollout computes
    merged, unmerged = (_rollout(args.rollout, model_dir, lora_rank) for lora_rank in (0, rank))
    merging = NativeRollout(model_dir, 0, torch.device("cpu"), merge_adapters=True) if args.rollout == "native" else None
    result = {"model": name, "rollout": args.rollout, "rank": rank, "params": sum(p.numel() for p in engine.model.parameters() if not p.requires_grad)}
    syncs = {
        "merged, every weight": lambda s: sync_weights(engine, merged, stats=s),
        "merged, adapted weights": lambda s: sync_weights(engine, merged, adapted_only=True, stats=s),
        "unmerged, base + adapters (first sync)": lambda s: sync_adapters(engine, unmerged, with_base=True, stats=s),
        "unmerged, adapters alone": lambda s: sync_adapters(engine, unmerged, with_base=False, stats=s),
    }
    if args.rollout == "vllm":  # its reload takes whole layers only (rlcore.rollout.vllm: keeps_weights)
        del syncs["merged, adapted weights"]
    else:  # the native engine merging the adapters it is sent into its own weights (merge_adapters)
        sync_adapters(engine, merging, with_base=True)
        syncs["unmerged, adapters alone, merged in by the rollout"] = lambda s: sync_adapters(engine, merging, with_base=False, stats=s)
    for label, fn in syncs.items():
        stats = {}
        seconds = _median(lambda: fn(stats), args.reps)
        result[label] = {"seconds": round(seconds, 4), "MiB": round(stats["bytes"] / 2**20, 2)}
    vocab = engine.hf_config.vocab_size
    result["decode tok/s, merged"] = round(_decode_tokens_per_s(merged, vocab, args.rows, args.tokens), 1)
    result["decode tok/s, adapters applied"] = round(_decode_tokens_per_s(unmerged, vocab, args.rows, args.tokens), 1)
    if merging is not None:
        result["decode tok/s, adapters merged in by the rollout"] = round(_decode_tokens_per_s(merging, vocab, args.rows, args.tokens), 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-qwen2,qwen2.5-0.5b")
    p.add_argument("--rollout", choices=("native", "vllm"), default="native", help="vllm: in .cache/vllm_venv (make vllm-env)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rows", type=int, default=16, help="prompts decoded at once")
    p.add_argument("--tokens", type=int, default=32, help="tokens decoded per prompt")
    args = p.parse_args()
    if args.rollout == "vllm" and "," in args.models:
        p.error("--rollout vllm: one model per process (vLLM's engines keep process-wide state); run --models NAME once for each")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory() as root:
            for name in args.models.split(","):
                r = one_model(name, args, root)
                print(json.dumps(r))
                full, adapters = r["merged, every weight"], r["unmerged, adapters alone"]
                print(f"{name}: a sync sends {adapters['MiB']} MiB of adapters vs {full['MiB']} MiB merged "
                      f"({full['MiB'] / adapters['MiB']:.0f}x less), {adapters['seconds']:.4f} vs {full['seconds']:.4f} s; decode "
                      f"{r['decode tok/s, adapters applied'] / r['decode tok/s, merged']:.2f}x merged's tokens/s with the adapters applied")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
