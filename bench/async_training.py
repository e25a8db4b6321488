"""Synchronous vs one-step-off vs fully asynchronous training on the tiny task, with a latency-bound scorer: the
same 2 CPU ranks (sync: both train and generate, the hybrid engine; async: 1 training + 1 rollout rank, split
pools), the same number of samples consumed. The scorer sleeps per call, with a long tail (one call in ten sleeps
ten times longer), as a remote judge or a sandbox does; `reward_model.score_workers` processes call it.

Prints per mode: samples/s over the steps after the first (the first pays start-up and first compilations), held-out
greedy accuracy after the last step, staleness mean/max and the seconds of a weight sync; the ratios to the
synchronous run; and writes the curves (mean reward by samples consumed and by wall clock) to --plot.

    .venv/bin/python bench/async_training.py                     # 60 steps x 256 samples per mode, ~8 min
    .venv/bin/python bench/async_training.py --steps 2 --val 8   # what tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from in_process import ROOT, demo_assets, demo_overrides, train

SCORER = """
import time, zlib
from rlcore.reward.scorers import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # a deterministic long tail: the same response always waits as long
    slow = zlib.crc32(solution_str.encode()) % 10 == 0
    time.sleep({sleep_s} * (10 if slow else 1))
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""

SPLIT = ["actor_rollout_ref.hybrid_engine=False", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"]
MODES = {
    "synchronous (hybrid, 2 ranks)": [],
    "one-step-off (1 + 1)": SPLIT + ["async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
                                     "async_training.partial_rollout=False"],
    "fully async (1 + 1, streamed)": SPLIT + ["async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
                                              "async_training.partial_rollout=False", "data.gen_batch_size=8"],
}


def run_mode(name: str, extra: list[str], args, workdir: str, assets: str) -> dict:
    run_dir = os.path.join(workdir, name.split()[0])
    overrides = [*demo_overrides(assets), f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.steps}",
                 "trainer.save_freq=-1", f"data.val_max_samples={args.val}", "trainer.logger=['jsonl']",
                 f"reward.custom_reward_function.path={workdir}/scorer.py", "reward.custom_reward_function.name=compute_score",
                 f"trainer.default_local_dir={run_dir}/ckpt", *extra]
    rows = [r for r in train(overrides, run_dir) if "val_generations" not in r]
    steps = [r for r in rows if r["step"] >= 1]
    samples_per_step = 256  # tiny_cpu: 32 prompts x 8
    span = steps[-1]["timing_s/elapsed"] - steps[0]["timing_s/elapsed"]
    stale = [r["async/staleness_mean"] for r in steps if "async/staleness_mean" in r]
    syncs = [r["async/weight_sync_s"] for r in steps if "async/weight_sync_s" in r]
    return {"samples_per_s": samples_per_step * (len(steps) - 1) / span, "val_before": rows[0]["val-core/tiny_add/reward/mean@1"],
            "val_after": steps[-1]["val-core/tiny_add/reward/mean@1"],
            "staleness_mean": statistics.mean(stale) if stale else 0.0,
            "staleness_max": max((r["async/staleness_max"] for r in steps if "async/staleness_max" in r), default=0),
            "sync_s": statistics.median(syncs) if syncs else None,
            "curve": [(r["step"] * samples_per_step, r["timing_s/elapsed"], r["critic/score/mean"]) for r in steps]}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_samples, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        samples, elapsed, score = zip(*r["curve"])
        smooth = [statistics.mean(score[max(0, i - 4):i + 1]) for i in range(len(score))]  # a step's reward is noisy
        by_samples.plot(samples, smooth, label=name)
        by_time.plot(elapsed, smooth, label=name)
    by_samples.set(xlabel="samples consumed", ylabel="mean training reward (5 steps)", title="learning per sample")
    by_time.set(xlabel="wall clock (s, from the first step)", ylabel="mean training reward (5 steps)", title="learning per second")
    by_samples.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--val", type=int, default=500, help="held-out prompts scored before and after")
    parser.add_argument("--sleep-ms", type=float, default=2.0, help="the scorer's wait per call (x10 for one call in ten)")
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "images", "async_training.png"))
    args = parser.parse_args(argv)
    assets = demo_assets()
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "scorer.py"), "w") as f:
            f.write(SCORER.format(sleep_s=args.sleep_ms / 1000))
        results = {name: run_mode(name, extra, args, workdir, assets) for name, extra in MODES.items()}
    base = results[next(iter(MODES))]["samples_per_s"]
    print(f"tiny task, {args.steps} steps x 256 samples per mode, scorer {args.sleep_ms:g} ms per call (x10 for 1 in 10), "
          f"2 score workers; accuracy: greedy on {args.val} held-out prompts")
    print(f"{'mode':32} {'samples/s':>9} {'vs sync':>7} {'acc before':>10} {'acc after':>9} {'stale mean':>10} {'stale max':>9} {'sync s':>7}")
    for name, r in results.items():
        sync = f"{r['sync_s']:.3f}" if r["sync_s"] is not None else "-"
        print(f"{name:32} {r['samples_per_s']:9.1f} {r['samples_per_s'] / base:6.2f}x {r['val_before']:10.3f} {r['val_after']:9.3f} "
              f"{r['staleness_mean']:10.2f} {r['staleness_max']:9.0f} {sync:>7}")
    if args.plot:
        with open(os.path.splitext(args.plot)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "results": results}, f)
        plot(results, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
