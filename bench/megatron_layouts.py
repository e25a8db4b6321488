"""The Megatron engine's layouts next to FSDP2 on the same work: 2 gloo ranks, one model, one batch.

Each layout runs the training-side passes of an RL step over the whole batch with 2 processes (one thread each):
compute_log_prob (no grad) and update_actor (forward + backward + optimizer step, one mini-batch), with the same
fixed micro-batch size per replica. FSDP2 splits the batch over 2 data-parallel ranks; Megatron TP2 / PP2 give
both ranks the whole batch and split the model instead; Megatron DP2 splits like FSDP2. Prints the median
seconds per pass over --reps repetitions (after one warm-up) and each layout's step time relative to FSDP2's.

    .venv/bin/python bench/megatron_layouts.py          # ~3.5 min on 2 cores (one pair of ranks for every layout)
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
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.config.actor_schema import ActorConfig
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.controller.worker import free_port
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.factory import build_engine
from rlcore.protocol import DataProto, position_ids_from_mask
from rlcore.workers.actor import compute_log_prob, update_policy

# The actor section of the schema (every key at its default) with this bench's loss settings.
ACTOR = OmegaConf.merge(OmegaConf.structured(ActorConfig), {
    "policy_loss": {"loss_mode": "vanilla"}, "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0, "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.0,
    "ppo_epochs": 1,
})
LAYOUTS = {  # name: (strategy, megatron section)
    "FSDP2, DP2": ("fsdp2", {}),
    "Megatron TP2": ("megatron", {"tensor_model_parallel_size": 2, "sequence_parallel": False}),
    "Megatron TP2 + SP": ("megatron", {"tensor_model_parallel_size": 2, "sequence_parallel": True}),
    "Megatron PP2": ("megatron", {"pipeline_model_parallel_size": 2}),
    "Megatron PP2 x VPP2": ("megatron", {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}),
    "Megatron DP2 (dist. optimizer)": ("megatron", {"use_distributed_optimizer": True}),
}


def build_model(path: str, args) -> None:
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=max(2, args.hidden // 64), num_key_value_heads=max(2, args.hidden // 128), tie_word_embeddings=False,
                         max_position_embeddings=args.prompt + args.response)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)


def make_batch(args) -> DataProto:
    g = torch.Generator().manual_seed(0)
    n, p, r = args.samples, args.prompt, args.response
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    response_mask = (torch.arange(r)[None] < torch.randint(r // 4, r + 1, (n, 1), generator=g)).long()
    responses = torch.randint(1, args.vocab, (n, r), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], -1)
    return DataProto.from_dict({
        "input_ids": torch.cat([torch.randint(1, args.vocab, (n, p), generator=g), responses], -1), "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask), "responses": responses, "response_mask": response_mask,
        "old_log_probs": -torch.rand(n, r, generator=g), "advantages": torch.randn(n, 1, generator=g).expand(n, r) * response_mask,
    })


def _time_layout(rank: int, layout: str, model_dir: str, args) -> dict[str, float] | None:
    """The median seconds of each pass of `layout` (rank 0's; None elsewhere)."""
    strategy, megatron = LAYOUTS[layout]
    megatron = MegatronConfig(**{"use_distributed_optimizer": True, "sequence_parallel": False, **megatron}) if strategy == "megatron" else None
    spec = EngineSpec(model_path=model_dir, megatron=megatron, param_dtype="float32", lr=1e-6)
    engine = build_engine(strategy, spec, torch.device("cpu"))
    data = make_batch(args).chunk(engine.dp_size)[engine.dp_rank]
    micro = MicroBatchSpec(rows=args.micro_batch_size)
    cfg = OmegaConf.merge(ACTOR, {"ppo_mini_batch_size": args.samples})
    seconds = {"compute_log_prob": [], "update_actor": []}
    for rep in range(args.reps + 1):
        dist.barrier()
        start = time.perf_counter()
        compute_log_prob(engine, data, micro, 1.0, with_entropy=True)
        dist.barrier()
        middle = time.perf_counter()
        update_policy(engine, data, cfg, micro, rollout_n=1, temperature=1.0)
        dist.barrier()
        if rep:  # the first repetition of each layout warms up allocators and caches
            seconds["compute_log_prob"].append(middle - start)
            seconds["update_actor"].append(time.perf_counter() - middle)
    return {k: statistics.median(v) for k, v in seconds.items()} if rank == 0 else None


def _rank(rank: int, port: int, model_dir: str, args, out: str) -> None:
    """Every layout in turn on the same 2 processes (one spawn: the ranks import torch and megatron-core once);
    megatron-core's groups are built for each Megatron layout and torn down after it."""
    from megatron.core import parallel_state as mpu

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    for layout in LAYOUTS:
        results[layout] = _time_layout(rank, layout, model_dir, args)
        dist.barrier()
        mpu.destroy_model_parallel()
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=192)
    parser.add_argument("--micro_batch_size", type=int, default=8, help="samples per micro-batch per replica")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        build_model(model_dir, args)
        out = os.path.join(tmp, "out.pt")
        mp.spawn(_rank, args=(free_port(), model_dir, args, out), nprocs=2, join=True)
        results = torch.load(out)
    print(f"{args.samples} samples x ({args.prompt} prompt + <= {args.response} response) tokens, Qwen2 hidden {args.hidden} x "
          f"{args.layers} layers, vocab {args.vocab}; 2 ranks x 1 thread; median of {args.reps} repetitions")
    base = sum(results["FSDP2, DP2"].values())
    print(f"{'layout':32s} {'log-prob s':>11s} {'update s':>9s} {'step s':>7s} {'vs FSDP2':>9s}")
    for layout, r in results.items():
        step = r["compute_log_prob"] + r["update_actor"]
        print(f"{layout:32s} {r['compute_log_prob']:11.3f} {r['update_actor']:9.3f} {step:7.3f} {step / base:8.2f}x")


if __name__ == "__main__":
    main()
