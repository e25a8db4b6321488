"""rlcore against Hugging Face TRL's GRPOTrainer on the same workload, same machine, one invocation.

The workload is bench/vs_trl/grpo_arith_cpu_v1.json (random-init 3.0M-parameter Qwen2, character tokenizer,
16 prompts x 4 samples x <= 32 tokens per step, fp32, exact-sum reward, one optimizer step per step). Both
trainers read the same model, tokenizer and prompts, built once here; they run alternately (rlcore, TRL, rlcore,
TRL, ...) so that a noisy neighbour hits both. Timed: the full RL step (generation, reward, [reference], policy
forward/backward, optimizer step), median over steps 2..N. TRL runs in its own venv (pinned in
bench/vs_trl/trl_constraints.txt; `bash bench/vs_trl/setup_trl_venv.sh` creates .cache/trl_venv, ~35 s).

    .venv/bin/python bench/vs_trl.py                 # beta 0 and 0.04, 2 runs each, ~5 min
    .venv/bin/python bench/vs_trl.py --no-trl        # rlcore only (no TRL venv needed)

On one CUDA device, the GPU workload (bench/vs_trl/grpo_arith_gpu_v1.json: a Qwen2.5-0.5B-shaped model, 64 prompts x
8 samples x <= 256 tokens, bf16, gradient checkpointing), with TRL importable by some python:

    python bench/vs_trl.py --spec bench/vs_trl/grpo_arith_gpu_v1.json --betas 0.001 --steps 4 --runs 1 --trl-python python3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from in_process import train  # noqa: E402  (bench/, this script's folder, is on the path)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vs_trl"))
from assets import DATA_SOURCE, SPEC_PATH, build_assets  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL_VENV = os.path.join(REPO, ".cache", "trl_venv")
PHASES = ("gen", "update_weights", "reward", "ref", "update_actor")


def rlcore_overrides(spec: dict, assets: str, steps: int, beta: float, ranks: int, out: str) -> list[str]:
    """The spec in verl's keys (rlcore's defaults where the spec agrees with them)."""
    g, device = spec["grpo"], spec["bench"]["device"]
    samples_per_rank = g["completions_per_step"] // ranks
    return [
        f"data.train_files={assets}/train.parquet", "data.val_files=null", "data.max_prompt_length=25",
        f"data.max_response_length={g['max_completion_length']}", f"data.train_batch_size={g['prompts_per_step']}",
        f"data.seed={spec['seed']}", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={assets}/model", "actor_rollout_ref.model.use_remove_padding=False",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={g['gradient_checkpointing']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={g['prompts_per_step']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={samples_per_rank}",
        f"actor_rollout_ref.actor.optim.lr={g['learning_rate']}", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.use_kl_loss={beta > 0}", f"actor_rollout_ref.actor.kl_loss_coef={beta}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", f"actor_rollout_ref.actor.fsdp_config.dtype={g['dtype']}",
        f"actor_rollout_ref.ref.fsdp_config.dtype={g['dtype']}", f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={samples_per_rank}",
        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={g['num_generations']}",
        f"actor_rollout_ref.rollout.dtype={g['dtype']}", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={samples_per_rank}",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"reward.custom_reward_function.path={assets}/exact_sum.py", "reward.custom_reward_function.name=exact_sum",
        f"trainer.device={device}", "trainer.nnodes=1", f"trainer.n_gpus_per_node={ranks}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={out}/ckpt", f"trainer.seed={spec['seed']}",
    ]


def run_rlcore(spec: dict, assets: str, steps: int, beta: float, ranks: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        rows = [r for r in train(rlcore_overrides(spec, assets, steps, beta, ranks, out), out) if "timing_s/step" in r]
    timed = rows[1:]  # step 1 warms up allocators and caches, as TRL's is skipped
    samples = spec["grpo"]["completions_per_step"]
    # Completion tokens/s as TRL's side counts them (up to and including <eos>): from a random init the two samplers'
    # lengths differ run to run, so samples/s alone would credit whichever drew shorter completions.
    tokens = sum(r["response_length/mean"] * samples for r in timed)
    result = {"median_step_s": statistics.median(r["timing_s/step"] for r in timed),
              "mean_reward_last": rows[-1]["critic/score/mean"],
              "completion_tokens_per_s": round(tokens / sum(r["timing_s/step"] for r in timed), 1),
              "mean_length": round(tokens / samples / len(timed), 1)}
    for phase in PHASES:
        if f"timing_s/{phase}" in timed[0]:
            result[phase] = statistics.median(r[f"timing_s/{phase}"] for r in timed)
    return result


def run_trl(python: str, spec_path: str, assets: str, steps: int, beta: float) -> dict | None:
    """TRL's result, or None after printing why it failed: rlcore's figures of the same invocation still report
    (on the GPU machine a failed TRL run must not cost the minutes rlcore's runs already took)."""
    cmd = [python, os.path.join(REPO, "bench", "vs_trl", "trl_side.py"), "--assets", assets, "--steps", str(steps), "--beta", str(beta),
           "--spec", spec_path]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        print(f"TRL failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_gflops(device: str) -> float:
    """The GEMM rate the FLOP-bound minimum is measured against, now: bf16 on CUDA, 2-thread fp32 on CPU."""
    if device == "cuda":
        from rlcore.utils.device import measure_gemm_flops

        return measure_gemm_flops(torch.device("cuda"), torch.bfloat16, 8192, reps=10) / 1e9
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        a @ b
    return 2 * 2048**3 * reps / (time.perf_counter() - start) / 1e9


def step_gflop(spec: dict, beta: float) -> dict[str, float]:
    """Matmul GFLOP of one full-length step (every sample 25 prompt + 32 completion tokens): the update's forward
    + backward (3 passes; the ~64 GFLOP of the spec's step), the sampling forward, and the reference forward."""
    m, g = spec["model"], spec["grpo"]
    h, f, layers, vocab = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["vocab_size"]
    kv = h // m["num_attention_heads"] * m["num_key_value_heads"]
    matmul_params = layers * (2 * h * h + 2 * h * kv + 3 * h * f) + h * vocab
    pass_gflop = 2 * matmul_params * g["completions_per_step"] * (25 + g["max_completion_length"]) / 1e9
    return {"update": 3 * pass_gflop, "sampling": pass_gflop, **({"reference": pass_gflop} if beta > 0 else {})}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.04])
    parser.add_argument("--ranks", type=int, default=1, help="rlcore CPU ranks (1 rank uses all cores as threads, as TRL)")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--spec", default=SPEC_PATH, help="the workload (bench/vs_trl/grpo_arith_{cpu,gpu}_v1.json)")
    parser.add_argument("--trl-python", default=os.path.join(TRL_VENV, "bin", "python"), help="a python that imports TRL")
    args = parser.parse_args(argv)
    use_trl = not args.no_trl
    if use_trl and not os.path.exists(args.trl_python) and not shutil.which(args.trl_python):
        sys.exit(f"no TRL python at {args.trl_python}: run `bash bench/vs_trl/setup_trl_venv.sh` first (or pass --no-trl)")
    with tempfile.TemporaryDirectory() as assets:
        spec = build_assets(assets, args.spec)
        device, dtype = spec["bench"]["device"], spec["grpo"]["dtype"]
        peak = peak_gflops(device)
        rate = f"bf16 GEMM {peak / 1e3:.0f} TFLOP/s measured" if device == "cuda" else f"fp32 GEMM peak {peak:.0f} GFLOP/s (2 threads)"
        print(f"workload {spec['name']} ({DATA_SOURCE}): {spec['grpo']['prompts_per_step']} prompts x {spec['grpo']['num_generations']} "
              f"samples x <= {spec['grpo']['max_completion_length']} tokens, {spec['model']['num_parameters'] / 1e6:.2f}M-parameter "
              f"Qwen2, {dtype}, on {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}; rlcore on {args.ranks} rank(s); {rate}")
        for beta in args.betas:
            results: dict[str, list[dict]] = {"rlcore": [], "trl": []}
            for _ in range(args.runs):  # alternate: a noisy neighbour slows both
                results["rlcore"].append(run_rlcore(spec, assets, args.steps, beta, args.ranks))
                print(f"rlcore run: {json.dumps(results['rlcore'][-1])}", flush=True)
                trl = run_trl(args.trl_python, args.spec, assets, args.steps, beta) if use_trl else None
                if trl is not None:
                    results["trl"].append(trl)
                    print(f"TRL run: {json.dumps(trl)}", flush=True)
            report(beta, results, step_gflop(spec, beta), peak, spec["grpo"]["completions_per_step"])


def report(beta: float, results: dict[str, list[dict]], parts: dict[str, float], peak: float, samples: int) -> None:
    rl = statistics.median(r["median_step_s"] for r in results["rlcore"])
    phases = ", ".join(f"{p} {statistics.median(r[p] for r in results['rlcore']):.3f}" for p in PHASES if p in results["rlcore"][0])
    gflop = sum(parts.values())
    split = " + ".join(f"{name} {value:.1f}" for name, value in parts.items())
    print(f"beta {beta}: FLOP-bound minimum ({split}) = {gflop:.1f} GFLOP / {peak:.0f} GFLOP/s = {gflop / peak:.3f} s per step")
    print(f"  rlcore  {rl:.3f} s/step (median of {len(results['rlcore'])} runs; {phases})")
    if results["trl"]:
        trl = statistics.median(r["median_step_s"] for r in results["trl"])
        print(f"  TRL     {trl:.3f} s/step (median of {len(results['trl'])} runs)")
        print(f"  samples/s: rlcore {samples / rl:.1f}, TRL {samples / trl:.1f}")
        tok = {side: statistics.median(r["completion_tokens_per_s"] for r in results[side] if r.get("completion_tokens_per_s"))
               for side in ("rlcore", "trl") if any(r.get("completion_tokens_per_s") for r in results[side])}
        if len(tok) == 2:
            print(f"  completion tokens/s: rlcore {tok['rlcore']:.0f}, TRL {tok['trl']:.0f} ({tok['rlcore'] / tok['trl']:.2f}x)")
        print(f"  rlcore throughput = {trl / rl:.2f}x TRL's; rlcore at {gflop / peak / rl:.0%} of the FLOP bound, TRL at {gflop / peak / trl:.0%}")


if __name__ == "__main__":
    main()
