"""Padded fixed micro-batches vs token-budget micro-batches vs token budgets + packed sequences.

Times the two training-side passes of an RL step, compute_log_prob and update_actor, on one FSDP2 rank over a
batch whose response lengths are skewed like RL rollouts (lognormal: most short, a few truncated at the maximum):

  (a) use_dynamic_bsz=False, use_remove_padding=False: fixed micro-batches padded to the batch width (verl's default)
  (b) use_dynamic_bsz=True: token-budget micro-batches, each cut to its own longest sample
  (c) use_dynamic_bsz=True + use_remove_padding=True: token budgets over packed (varlen) sequences

Every mode gets the same per-micro-batch token budget (a's micro-batch rows x batch width), i.e. the same memory.
Prints valid tokens/s per pass, the ratios c/a and b/a, and the fraction of this machine's fp32 matmul peak
(measured in the same run) that (c) reaches in model FLOPs. Usage:

    .venv/bin/python bench/dynamic_bsz.py            # ~5 min on 2 cores; --samples 8 for a quicker look
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.config.actor_schema import ActorConfig
from rlcore.controller.worker import free_port
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.hf import quiet_transformers
from rlcore.protocol import DataProto, position_ids_from_mask
from rlcore.workers.actor import compute_log_prob, update_policy

ACTOR = {
    "policy_loss": {"loss_mode": "vanilla"}, "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0, "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.0, "ppo_epochs": 1,
}


def build_model(path: str, args) -> Qwen2Config:
    """A Qwen2-architecture model of ~36M parameters (random weights: throughput does not depend on them)."""
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64, tie_word_embeddings=False,
        max_position_embeddings=args.max_prompt + args.max_response,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return config


def skewed_batch(args, vocab: int) -> DataProto:
    """Left-padded prompts of uniform length, right-padded responses of lognormal length; `--truncated` of them
    at max_response (responses that hit the length limit)."""
    g = torch.Generator().manual_seed(args.seed)
    n, p_max, r_max = args.samples, args.max_prompt, args.max_response
    prompt_lens = torch.randint(p_max // 4, p_max + 1, (n,), generator=g)
    normal = torch.randn(n, generator=g)
    response_lens = torch.exp(math.log(args.median_response) + args.sigma * normal).round().clamp(4, r_max).long()
    response_lens[torch.randperm(n, generator=g)[: args.truncated]] = r_max
    cols = torch.arange(p_max + r_max)[None]
    prompt_mask = (cols[:, :p_max] >= p_max - prompt_lens[:, None]).long()
    response_mask = (cols[:, :r_max] < response_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], -1)
    input_ids = torch.randint(1, vocab, (n, p_max + r_max), generator=g) * attention_mask
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
        "responses": input_ids[:, p_max:], "response_mask": response_mask,
        "old_log_probs": -torch.rand(n, r_max, generator=g) * response_mask, "advantages": torch.randn(n, 1, generator=g).expand(n, r_max) * response_mask,
    })


def model_flops_per_forward(config: Qwen2Config, data: DataProto) -> float:
    """FLOPs a perfect packed implementation needs for one forward: 2 x non-embedding params per valid token,
    causal attention 2 x 2 x len(len+1)/2 x hidden per layer per sequence, and the vocabulary projection on the
    response-predicting states only."""
    h, layers = config.hidden_size, config.num_hidden_layers
    per_token = 2 * layers * (4 * h * h + 3 * h * config.intermediate_size)  # q, k, v, o + gate, up, down
    lengths = data.batch["attention_mask"].sum(-1).double()
    attention = layers * 2 * 2 * h * (lengths * (lengths + 1) / 2).sum()
    head = 2 * h * config.vocab_size * data.batch["response_mask"].sum()
    return float(per_token * lengths.sum() + attention + head)


def matmul_peak_flops(threads: int, size: int = 2048, reps: int = 5) -> float:
    """Best fp32 GEMM FLOP/s of this machine with the benchmark's thread count."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def time_modes(model_dir: str, data: DataProto, modes: dict, reps: int) -> dict[str, dict[str, float]]:
    """Best-of-reps seconds per mode of compute_log_prob and of one update_actor mini-batch (forward, backward,
    AdamW step). Modes take turns within each round, so drift in the machine's speed hits all of them alike;
    round 0 warms up allocators and thread pools and is not counted."""
    engines = {key: FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=packed, lr=1e-6), torch.device("cpu"))
               for key, (_, packed, _, _) in modes.items()}
    cfg = OmegaConf.merge(OmegaConf.structured(ActorConfig), {**ACTOR, "ppo_mini_batch_size": len(data)})  # every key at its default
    seconds = {key: {"compute_log_prob": math.inf, "update_actor": math.inf} for key in modes}
    for round_index in range(reps + 1):
        for key, (_, _, log_prob_spec, update_spec) in modes.items():
            start = time.perf_counter()
            compute_log_prob(engines[key], data, log_prob_spec, temperature=1.0, with_entropy=True)
            middle = time.perf_counter()
            update_policy(engines[key], data, cfg, update_spec, rollout_n=1, temperature=1.0)
            end = time.perf_counter()
            if round_index > 0 or reps == 0:
                seconds[key]["compute_log_prob"] = min(seconds[key]["compute_log_prob"], middle - start)
                seconds[key]["update_actor"] = min(seconds[key]["update_actor"], end - middle)
    return seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=32, help="samples on the rank (one mini-batch)")
    ap.add_argument("--max_prompt", type=int, default=128)
    ap.add_argument("--max_response", type=int, default=512)
    ap.add_argument("--median_response", type=float, default=64.0)
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of response lengths")
    ap.add_argument("--truncated", type=int, default=2, help="responses at max_response")
    ap.add_argument("--micro_batch_size", type=int, default=4, help="(a) samples per micro-batch (update)")
    ap.add_argument("--log_prob_micro_batch_size", type=int, default=8, help="(a) samples per micro-batch (log-prob)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2, help="timed rounds per mode after a warm-up round (best is kept)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    quiet_transformers()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(minutes=30))
    model_dir = tempfile.mkdtemp(prefix="rlcore_bench_model_")
    config = build_model(model_dir, args)
    data = skewed_batch(args, config.vocab_size)
    num_params = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
    width = args.max_prompt + args.max_response
    lengths = data.batch["response_mask"].sum(-1).float()
    valid = int(data.batch["attention_mask"].sum())
    print(f"model: Qwen2 {num_params / 1e6:.1f}M params ({args.layers} layers, hidden {args.hidden}, vocab {args.vocab}); "
          f"{args.threads} threads")
    print(f"batch: {args.samples} samples, width {width} (prompt <= {args.max_prompt}, response <= {args.max_response}); "
          f"response length median {lengths.median():.0f}, mean {lengths.mean():.0f}, max {lengths.max():.0f}; "
          f"{valid} valid of {args.samples * width} padded tokens ({valid / (args.samples * width):.0%})")

    peak = matmul_peak_flops(args.threads)
    log_prob_budget, update_budget = args.log_prob_micro_batch_size * width, args.micro_batch_size * width
    print(f"fp32 matmul peak (2048^3 GEMM, best of 5): {peak / 1e9:.1f} GFLOP/s")
    print(f"token budgets (= (a)'s micro-batch rows x width): log-prob {log_prob_budget}, update {update_budget}\n")
    modes = {
        "a": ("padded, fixed micro-batches", False, MicroBatchSpec(rows=args.log_prob_micro_batch_size), MicroBatchSpec(rows=args.micro_batch_size)),
        "b": ("dynamic bsz", False, MicroBatchSpec(max_tokens=log_prob_budget), MicroBatchSpec(max_tokens=update_budget)),
        "c": ("dynamic bsz + remove padding", True, MicroBatchSpec(max_tokens=log_prob_budget, packed=True),
              MicroBatchSpec(max_tokens=update_budget, packed=True)),
    }
    flops = {"compute_log_prob": model_flops_per_forward(config, data)}
    flops["update_actor"] = 3 * flops["compute_log_prob"]  # forward + backward (2x)
    seconds = time_modes(model_dir, data, modes, args.reps)
    print(f"{'mode':<34} {'pass':<17} {'seconds':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'of peak':>8}")
    for key, (name, _, _, _) in modes.items():
        for pass_name, s in seconds[key].items():
            print(f"({key}) {name:<30} {pass_name:<17} {s:8.2f} {valid / s:9.0f} {flops[pass_name] / s / 1e9:8.1f} "
                  f"{flops[pass_name] / s / peak:8.1%}", flush=True)
    print()
    total = {k: sum(v.values()) for k, v in seconds.items()}
    for pass_name in ("compute_log_prob", "update_actor"):
        print(f"{pass_name:<17} c/a = {seconds['a'][pass_name] / seconds['c'][pass_name]:.2f}   "
              f"b/a = {seconds['a'][pass_name] / seconds['b'][pass_name]:.2f}")
    print(f"{'both passes':<17} c/a = {total['a'] / total['c']:.2f}   b/a = {total['a'] / total['b']:.2f}   "
          f"(c) reaches {sum(flops.values()) / total['c'] / peak:.1%} of the fp32 matmul peak")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
