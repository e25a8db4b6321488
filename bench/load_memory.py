"""Host memory while the FSDP2 engine loads a checkpoint: each rank's peak resident-set growth, as a fraction of the
whole fp32 model, for the sharded load (built on the meta device, each rank reads its own rows) against the load
rlcore did before (every rank reads the whole checkpoint, then shards it). The loaded weights must equal the
checkpoint's exactly in both modes.

    python bench/load_memory.py                       # a Qwen2.5-0.5B-shaped random model (2 GB fp32), 2 ranks
    python bench/load_memory.py --shape small         # ~60M parameters (what tests/engine/test_sharded_load.py runs)
    python bench/load_memory.py --backend megatron    # the Megatron engine at TP2: each rank reads its TP pieces
    python bench/load_memory.py --kind value          # a critic (value model) over the causal LM's checkpoint
    python bench/load_memory.py --kind lora           # LoRA (rank 8, every linear) over the causal LM's checkpoint
    python bench/load_memory.py --shape small-moe     # a Qwen3-MoE (16 experts): each rank reads its experts' rows
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from dist_utils import close_gloo, init_gloo, spawn_ranks  # noqa: E402

SHAPES = {  # Qwen2 configs (the built-in Qwen2.5-0.5B shape and a small one for CI) and a small Qwen3-MoE
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "small": dict(model_type="qwen2", vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    # Experts hold 3/4 of it: a checkpoint names them one tensor per expert, the model fuses them (rlcore.models.experts).
    "small-moe": dict(model_type="qwen3_moe", vocab_size=16000, hidden_size=512, intermediate_size=1536, moe_intermediate_size=384,
                      num_experts=16, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=64, tie_word_embeddings=False),
}


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _rank(rank, port, world, model_dir, whole, out, kind="causal_lm"):
    import rlcore.engine.fsdp2 as fsdp2
    from rlcore.engine.base import EngineSpec
    from rlcore.engine.sharded_load import parameters_on_meta
    from rlcore.models.experts import to_checkpoint_names
    from rlcore.models.hf import load_causal_lm, load_value_model
    from rlcore.models.lora import LoraSpec

    init_gloo(rank, world, port)
    torch.manual_seed(0)  # LoRA's A: every rank draws the same
    if whole:  # the load before: the whole checkpoint on every rank, sharded after
        fsdp2.safetensors_files = lambda path: None
    with parameters_on_meta():  # imports and first-use set-up of the modeling code are not the load's memory
        (load_value_model if kind == "value" else load_causal_lm)(model_dir, weights=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak resident set (VmHWM) to the current one
    before = rss_kib("VmRSS")
    spec = EngineSpec(model_path=model_dir, kind="value" if kind == "value" else "causal_lm", trainable=kind == "lora",
                      lora=LoraSpec(8, 16) if kind == "lora" else None)
    engine = fsdp2.FSDP2Engine(spec, torch.device("cpu"))
    growth = (rss_kib("VmHWM") - before) * 1024
    if kind != "value":  # LoRA: merged weights, W + s * B @ A with B still zero: the checkpoint's exactly
        weights = dict(to_checkpoint_names(engine.rollout_weights()))  # collective; gathered after the measurement
    else:  # a critic: its trunk is the checkpoint's (its head is drawn, the checkpoint's lm_head unused)
        weights = {name: p.full_tensor() for name, p in engine.model.named_parameters() if name != "score.weight"}
    if rank == 0:
        from safetensors.torch import load_file

        checkpoint = load_file(os.path.join(model_dir, "model.safetensors"))
        full_bytes = sum(t.numel() * 4 for t in checkpoint.values())
        if kind == "value":
            checkpoint = {k: v for k, v in checkpoint.items() if k != "lm_head.weight"}
        exact = weights.keys() == checkpoint.keys() and all(torch.equal(weights[k], v) for k, v in checkpoint.items())
        torch.save({"growth": growth, "exact": exact, "full_bytes": full_bytes}, out)
    close_gloo()


def _megatron_rank(rank, port, world, model_dir, out):
    from rlcore.config.megatron_schema import MegatronConfig
    from rlcore.engine.base import EngineSpec
    from rlcore.engine.megatron import MegatronEngine

    init_gloo(rank, world, port)
    megatron = MegatronConfig(tensor_model_parallel_size=world, pipeline_model_parallel_size=1, sequence_parallel=False,
                              use_distributed_optimizer=True, seed=1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_kib("VmRSS")
    engine = MegatronEngine(EngineSpec(model_path=model_dir, trainable=False, megatron=megatron, param_dtype="float32"), torch.device("cpu"))
    growth = (rss_kib("VmHWM") - before) * 1024
    weights = dict(engine.rollout_weights())
    if rank == 0:
        from safetensors.torch import load_file

        checkpoint = load_file(os.path.join(model_dir, "model.safetensors"))
        exact = all(torch.equal(weights[k], v) for k, v in checkpoint.items() if k in weights)
        torch.save({"growth": growth, "exact": exact, "full_bytes": sum(t.numel() * 4 for t in checkpoint.values())}, out)
    close_gloo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", choices=("fsdp2", "megatron"), default="fsdp2")
    parser.add_argument("--kind", choices=("causal_lm", "value", "lora"), default="causal_lm",
                        help="value: a critic over the causal LM; lora: LoRA adapters over it")
    args = parser.parse_args(argv)
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        torch.manual_seed(0)
        shape = dict(SHAPES[args.shape])
        config = AutoConfig.for_model(shape.pop("model_type"), max_position_embeddings=512, **shape)
        AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
        results = {}
        # New rank processes each time (fresh=True): a rank's peak resident set is the measurement, and the whole-load
        # mode patches fsdp2 in its process.
        if args.backend == "megatron":
            out = os.path.join(tmp, "megatron.pt")
            spawn_ranks(_megatron_rank, args.world, lambda port: (port, args.world, model_dir, out), fresh=True)
            r = torch.load(out)
            print(f"megatron TP{args.world}, {args.shape}: peak host-memory growth per rank {r['growth'] / 2**30:.2f} GiB = "
                  f"{r['growth'] / r['full_bytes']:.2f} of the fp32 model  weights exact: {r['exact']}")
            return 0 if r["exact"] else 1
        for mode, whole in (("sharded", False), ("whole-then-shard", True)):
            out = os.path.join(tmp, f"{mode}.pt")
            spawn_ranks(_rank, args.world, lambda port: (port, args.world, model_dir, whole, out, args.kind), fresh=True)
            results[mode] = torch.load(out)
    full = results["sharded"]["full_bytes"]
    print(f"{args.shape} ({args.kind}): {full / 4 / 1e6:.0f}M parameters, {full / 2**30:.2f} GiB in fp32, {args.world} ranks")
    for mode, r in results.items():
        print(f"  {mode:<18} peak host-memory growth per rank {r['growth'] / 2**30:6.2f} GiB = {r['growth'] / full:.2f} of the model"
              f"  weights exact: {r['exact']}")
    print(f"growth fractions: sharded {results['sharded']['growth'] / full:.2f} whole {results['whole-then-shard']['growth'] / full:.2f}")
    return 0 if all(r["exact"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
