"""GRPO steps with verl's GPU defaults on realistic shapes: the check anyone with a GPU can run (`make bench-gpu`).

Builds random-initialised Qwen2.5-0.5B-shaped (tied) and Qwen3-0.6B-shaped models over the tiny task's character
tokenizer (no hub), then runs a few GRPO steps through the real trainer (Ray, controller, workers) with verl's
GPU defaults: bf16, `use_dynamic_bsz=True`, gradient checkpointing, 64 prompts x 8 samples x up to 256 response
tokens, on FSDP2 and on Megatron (TP1 on one GPU, TP2 when two are visible), padded and packed
(`use_remove_padding`), with the native rollout engine and with vLLM (`--rollouts native,vllm`). Per run it
prints each phase's seconds (median over the steps after the first), MFU against the device's nominal bf16 peak
(rlcore's perf metrics) and against a bf16 matmul rate measured at the start of the same run, the peak memory
against `rlcore-plan`'s estimate, the weight sync's seconds and bytes, what the rollout phase's memory ledger
counts beside `torch.cuda.memory_allocated`, and the rollout's generated tokens/s against HF `generate` on the
same model and batch (same sampling, same max_new_tokens, stopping at EOS like the engine). `--json FILE` also
writes every run's figures as JSON.

    python bench/gpu_step.py                       # on a CUDA machine, ~10 min on one H100
    python bench/gpu_step.py --models qwen3-0.6b --engines fsdp2 --modes packed --rollouts native,vllm --steps 2
The CPU suite runs it on a tiny model (`--device cpu --models tiny-qwen3 ...`) so it keeps working.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

PHASES = ("gen", "update_weights", "old_log_prob", "ref", "update_actor", "step")


def engine_overrides(engine: str, gpus: int) -> tuple[str, list[str]]:
    """(config name, overrides) of one training backend; Megatron runs TP over every visible GPU (1 or 2)."""
    if engine == "megatron":
        return "ppo_megatron_trainer", [f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={min(gpus, 2)}"]
    return "ppo_trainer", ["actor_rollout_ref.actor.strategy=fsdp2"]


def compose_run(args, model_dir: str, data_dir: str, out_dir: str, engine: str, packed: bool, rollout: str = "native"):
    from rlcore.config import compose

    gpus = torch.cuda.device_count() if args.device == "cuda" else 1
    config_name, overrides = engine_overrides(engine, gpus)
    dtype = [f"actor_rollout_ref.{role}.{section}.dtype={args.dtype}" for role in ("actor", "ref") for section in ("fsdp_config", "megatron")]
    return compose([
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={args.prompts}", "data.max_prompt_length=16", f"data.max_response_length={args.response_length}",
        "data.dataloader_num_workers=0", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        f"actor_rollout_ref.model.use_remove_padding={packed}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, args.prompts // 4)}", "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001", *dtype,
        f"actor_rollout_ref.rollout.name={rollout}", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.rollout.dtype={args.dtype}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"trainer.device={args.device}", f"trainer.n_gpus_per_node={gpus}", "trainer.logger=[console,jsonl]",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.default_local_dir={out_dir}/ckpt", "trainer.max_worker_restarts=0",
        *overrides, *args.override,
    ], config_name=config_name)


def run_one(args, model_dir: str, data_dir: str, out_dir: str, engine: str, packed: bool, rollout: str = "native") -> dict:
    from rlcore.config.validate import diagnose
    from rlcore.plan import memory_plan
    from rlcore.train import run

    cfg = compose_run(args, model_dir, data_dir, out_dir, engine, packed, rollout)
    plan, _ = diagnose(cfg)
    estimate = max(role.peak for role in memory_plan(cfg, plan).roles)
    run(cfg, out_dir)
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "timing_s/step" in r]
    timed = rows[1:] or rows  # the first step pays warm-up (allocator, kernels)
    med = lambda key: statistics.median(r.get(key, float("nan")) for r in timed)  # noqa: E731
    samples = args.prompts * args.n
    last = rows[-1]
    return {
        **{p: med(f"timing_s/{p}") for p in PHASES},
        "mfu_update": med("perf/mfu/update_actor"), "mfu_ref": med("perf/mfu/ref"),
        "peak_gib": max(r.get("perf/max_memory_allocated_gb", float("nan")) for r in rows), "plan_gib": estimate,
        "gen_tokens_per_s": med("response_length/mean") * samples / med("timing_s/gen"),
        "response_length": med("response_length/mean"), "sync_gib": med("rollout/weights_synced_gib"),
        # The rollout's ledger while generating, and the device as a whole (vLLM's sleep pool bypasses PyTorch's
        # allocator) while generating, after the engine slept, and before it was built.
        "gen_ledger_gib": sum(v for k, v in last.items() if k.startswith("perf/memory/generate/") and k.endswith("_gib")
                              and k.rsplit("/", 1)[1] not in ("allocated_gib", "peak_gib", "device_used_gib")),
        "gen_allocated_gib": last.get("perf/memory/generate/allocated_gib", float("nan")),
        "gen_device_gib": last.get("perf/memory/generate/device_used_gib", float("nan")),
        "asleep_device_gib": last.get("perf/memory/rollout_asleep/device_used_gib", float("nan")),
        "before_rollout_device_gib": last.get("perf/memory/before_rollout/device_used_gib", float("nan")),
        "log_ppl_abs_diff": med("rollout_corr/log_ppl_abs_diff"), "k3_kl": med("rollout_corr/k3_kl"),
        # The native engine's scheduling: prefills (one per admitted wave of prompt groups), decode-graph captures after
        # each wake-up and the seconds they took (rollout/graphs.py), against the generation phase's seconds.
        "prefills": med("rollout/prefills"), "graph_captures": med("rollout/graph_captures"), "graph_capture_s": med("rollout/graph_capture_s"),
    }


def hf_generate_tokens_per_s(args, model_dir: str, data_dir: str) -> float:
    """HF `generate` on the trainer's first batch of prompts, each repeated n times, the same sampling and limit."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = pq.read_table(f"{data_dir}/train.parquet").to_pylist()[: args.prompts]
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    tokenizer.padding_side = "left"
    enc = tokenizer([t for t in texts for _ in range(args.n)], return_tensors="pt", padding=True).to(device)
    dtype = torch.bfloat16 if args.dtype in ("bfloat16", "bf16") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    kwargs = dict(max_new_tokens=args.response_length, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        model.generate(**enc, **dict(kwargs, max_new_tokens=4))  # warm-up
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        out = model.generate(**enc, **kwargs)[:, enc["input_ids"].shape[1]:]
        sync()
        seconds = time.perf_counter() - start
    del model  # the runs' workers share this device: give back what generate held
    if device.type == "cuda":
        print(f"HF generate held up to {torch.cuda.max_memory_reserved() / 2**30:.1f} GiB in this process", flush=True)
        torch.cuda.empty_cache()
    ended = (out == tokenizer.eos_token_id).int().cumsum(-1)
    generated = int(((ended == 0) | ((ended == 1) & (out == tokenizer.eos_token_id))).sum())  # up to and incl. EOS
    return generated / seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="qwen2.5-0.5b,qwen3-0.6b", help="rlcore.models.random_init.SHAPES names")
    p.add_argument("--engines", default="fsdp2,megatron")
    p.add_argument("--modes", default="padded,packed")
    p.add_argument("--rollouts", default="native", help="rollout engines: native, vllm (vLLM needs its CUDA build)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None, help="where models, data and runs go (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write every run's figures to this JSON file")
    p.add_argument("--skip-hf", action="store_true", help="no HF generate baseline (its tokens/s column is nan)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override added to every run (repeatable), e.g. to time a change against verl's defaults")
    p.add_argument("--tag", default="", help="appended to each run's name (which overrides it ran with)")
    args = p.parse_args(argv)

    from rlcore.data.synthetic import write_task
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import build_model_dir
    from rlcore.utils.device import measure_gemm_flops, nominal_peak_flops

    out = args.out or tempfile.mkdtemp(prefix="rlcore_gpu_step_")
    data_dir = os.path.join(out, "data")
    write_task(data_dir, num_train=max(512, args.prompts * args.steps), num_test=64, min_digits=1, max_digits=2, seed=0)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    nominal = nominal_peak_flops(device_name) if args.device == "cuda" else None
    # The MFU metrics divide by the data sheet's peak; this run's own bf16 matmul rate is the other denominator.
    measured = measure_gemm_flops(torch.device("cuda"), torch.bfloat16, 8192, reps=10) if args.device == "cuda" else None
    if measured:
        print(f"{device_name}: bf16 8192^3 matmul {measured / 1e12:.0f} TFLOP/s measured, "
              f"{nominal / 1e12 if nominal else float('nan'):.0f} nominal", flush=True)
    results = []
    for model in args.models.split(","):
        model_dir = build_model_dir(os.path.join(out, "models", model), model, build_char_tokenizer())
        hf = float("nan") if args.skip_hf else hf_generate_tokens_per_s(args, model_dir, data_dir)
        for engine in args.engines.split(","):
            for mode in args.modes.split(","):
                for rollout in args.rollouts.split(","):
                    name = f"{model} {engine} {mode} {rollout}" + (f" {args.tag}" if args.tag else "")
                    r = run_one(args, model_dir, data_dir, os.path.join(out, "runs", name.replace(" ", "_")), engine, mode == "packed", rollout)
                    if measured and nominal:
                        r["mfu_update_measured"] = r["mfu_update"] * nominal / measured
                    r["hf_tokens_per_s"] = hf
                    results.append((name, r, hf))
                    print(f"\n{name}: {json.dumps(r)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__, "measured_bf16_flops": measured, "nominal_bf16_flops": nominal,
                       "args": vars(args), "runs": {name: r for name, r, _ in results}}, f, indent=1)
    report(args, device_name, measured, results)


def report(args, device_name: str, measured: float | None, results: list) -> None:
    print(f"\n{device_name}, torch {torch.__version__}, {args.prompts} prompts x {args.n} samples x <= {args.response_length} tokens, "
          f"{args.dtype}, median of steps 2..{args.steps} (seconds)" + (f"; MFU* against {measured / 1e12:.0f} TFLOP/s measured here" if measured else ""))
    header = (f"{'run':41} {'gen':>6} {'sync':>5} {'old_lp':>6} {'ref':>6} {'update':>7} {'step':>7} {'MFU upd':>7} {'MFU*':>6} "
              f"{'peak/plan GiB':>14} {'gen tok/s':>9} {'HF tok/s':>9} {'gen/HF':>6}")
    print(header)
    for name, r, hf in results:
        print(f"{name:41} {r['gen']:6.2f} {r['update_weights']:5.2f} {r['old_log_prob']:6.2f} {r['ref']:6.2f} {r['update_actor']:7.2f} {r['step']:7.2f} "
              f"{r['mfu_update']:7.1%} {r.get('mfu_update_measured', float('nan')):6.1%} {r['peak_gib']:6.1f}/{r['plan_gib']:<7.1f} "
              f"{r['gen_tokens_per_s']:9.0f} {hf:9.0f} {r['gen_tokens_per_s'] / hf:5.2f}x")
    print(f"\n{'run':41} {'sync GiB':>8} {'ledger GiB':>10} {'alloc GiB':>9} {'device GiB: gen':>15} {'asleep':>7} {'before':>7} {'|dlogppl|':>9} {'k3 KL':>8}")
    for name, r, _ in results:
        print(f"{name:41} {r['sync_gib']:8.3f} {r['gen_ledger_gib']:10.2f} {r['gen_allocated_gib']:9.2f} {r['gen_device_gib']:15.2f} "
              f"{r['asleep_device_gib']:7.2f} {r['before_rollout_device_gib']:7.2f} {r['log_ppl_abs_diff']:9.2e} {r['k3_kl']:8.2e}")
    print(f"\n{'run':41} {'prefills':>8} {'captures':>8} {'capture s':>9} {'of gen':>6}")
    for name, r, _ in results:
        print(f"{name:41} {r['prefills']:8.0f} {r['graph_captures']:8.0f} {r['graph_capture_s']:9.2f} {r['graph_capture_s'] / r['gen']:6.1%}")
    for model in args.models.split(","):  # the packed-vs-padded target: packed update no slower than padded
        for engine in args.engines.split(","):
            for rollout in args.rollouts.split(","):
                tag = f" {args.tag}" if args.tag else ""
                by_mode = {mode: r for name, r, _ in results for mode in ("padded", "packed") if name == f"{model} {engine} {mode} {rollout}{tag}"}
                if len(by_mode) == 2:
                    ratio = by_mode["packed"]["update_actor"] / by_mode["padded"]["update_actor"]
                    print(f"{model} {engine} {rollout}: packed/padded update time {ratio:.2f}x")

if __name__ == "__main__":
    sys.exit(main())
