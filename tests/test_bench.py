"""The benchmark scripts keep running (tiny settings; their figures are measured by hand, not asserted here).

Each runs in this process, as `main(argv)`: the same code as `python bench/<name>.py argv`, without a fresh
interpreter importing torch and rlcore again, and the training benchmarks' runs join the pytest run's Ray cluster."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench(capsys, name: str, *argv: str) -> str:
    """What `python bench/<name>.py *argv` prints, run in this process."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))  # the scripts import their folder's helpers as `python bench/x.py` lets them
    importlib.import_module(name).main(list(argv))
    return capsys.readouterr().out


def test_dynamic_bsz_benchmark_prints_every_mode_and_the_ratios(capsys):
    args = ["--samples", "4", "--max_prompt", "8", "--max_response", "24", "--median_response", "6", "--truncated", "1",
            "--micro_batch_size", "2", "--log_prob_micro_batch_size", "2", "--hidden", "128", "--layers", "1", "--vocab", "128",
            "--reps", "0", "--threads", "1"]
    out = bench(capsys, "dynamic_bsz", *args)
    for mode in ("(a) padded, fixed micro-batches", "(b) dynamic bsz", "(c) dynamic bsz + remove padding"):
        assert out.count(mode) == 2, out  # compute_log_prob and update_actor
    ratios = re.search(r"both passes\s+c/a = ([\d.]+)\s+b/a = ([\d.]+).*reaches ([\d.]+)% of the fp32 matmul peak", out)
    assert ratios and all(float(x) > 0 for x in ratios.groups()), out


def test_prefix_grouper_benchmark_prints_both_passes_and_equal_log_probs(capsys):
    out = bench(capsys, "prefix_grouper", "--prompt", "16", "--response", "4", "--n", "2", "--prompts", "2", "--hidden", "64",
                "--layers", "1", "--vocab", "64", "--repeats", "1")
    diff = re.search(r"max \|log-prob diff\| ([\d.e+-]+)", out)
    assert diff and float(diff.group(1)) < 1e-4, out
    assert len(re.findall(r"speed-up [\d.]+x", out)) == 2, out


def test_moe_rollout_benchmark_prints_parity_and_both_engines_against_hf(capsys):
    out = bench(capsys, "moe_rollout", "--prompts", "2", "--n", "2", "--max_tokens", "4", "--reps", "1")
    parity = re.findall(r"greedy rows equal to HF generate ([\d.]+), .* max \|log-prob - training forward\| ([\d.e+-]+)", out)
    assert len(parity) == 2 and all(float(rows) == 1.0 and float(diff) < 1e-4 for rows, diff in parity), out  # fp32: exact
    assert len(re.findall(r"^(skewed|uniform)\s+[\d.]+\s+\d+\s+\d+\s+\d+\s+[\d.]+x$", out, re.MULTILINE)) == 2, out


@pytest.mark.slow
def test_megatron_layouts_benchmark_prints_every_layout_against_fsdp2(capsys):
    pytest.importorskip("megatron.core")
    args = ["--samples", "8", "--prompt", "4", "--response", "8", "--micro_batch_size", "2", "--hidden", "128", "--layers", "4",
            "--vocab", "128", "--reps", "1"]
    out = bench(capsys, "megatron_layouts", *args)
    rows = re.findall(r"^(FSDP2, DP2|Megatron [^\n]+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out, re.MULTILINE)
    assert len(rows) == 6 and rows[0][4] == "1.00", out


@pytest.mark.slow
def test_weight_sync_benchmark_prints_each_mode_against_memcpy(capsys):
    args = ["--hidden", "128", "--layers", "2", "--vocab", "256", "--reps", "2"]
    out = bench(capsys, "weight_sync", *args)
    rows = dict(re.findall(r"^(per tensor \(bucket 0\)|bucketed \(2048 MB\)|gloo all-gather alone|memcpy)\s+[\d.]+ ms\s+([\d.]+)x memcpy$",
                           out, re.MULTILINE))
    assert len(rows) == 4 and rows["memcpy"] == "1.0", out


@pytest.mark.slow
def test_vs_trl_benchmark_times_rlcore_on_the_spec_and_prints_the_flop_bound(capsys, ray_cluster):
    out = bench(capsys, "vs_trl", "--no-trl", "--steps", "3", "--runs", "1", "--betas", "0.04")
    bound = re.search(r"beta 0.04: FLOP-bound minimum \(update ([\d.]+) \+ sampling ([\d.]+) \+ reference ([\d.]+)\)", out)
    assert bound and float(bound.group(1)) == pytest.approx(3 * float(bound.group(2)), abs=0.2), out  # ~64 GFLOP of fwd+bwd
    assert 60 < float(bound.group(1)) < 70, out
    step = re.search(r"rlcore\s+([\d.]+) s/step .*gen [\d.]+.*ref [\d.]+.*update_actor [\d.]+", out)
    assert step and float(step.group(1)) > 0, out


def test_optimizer_step_benchmark_times_every_adamw_kernel(capsys):
    """bench/optimizer_step.py on 2 layers: a row per kernel over the same 26 tensors (times: printed, not asserted)."""
    from dist_utils import free_port, init_gloo

    init_gloo(0, 1, free_port())  # the bench joins this group (conftest tears it down)
    out = bench(capsys, "optimizer_step", "--layers", "2", "--reps", "1")
    rows = re.findall(r"^(per-parameter loop|foreach|fused|rlcore's default here)\s+(\d+)\s+([\d.]+)$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["per-parameter loop", "foreach", "fused", "rlcore's default here"], out
    assert {r[1] for r in rows} == {"26"} and all(float(r[2]) > 0 for r in rows), out


def test_decode_buckets_benchmark_counts_the_buckets_and_captures(capsys):
    """bench/decode_buckets.py on a small rollout: capture_after=1 captures every bucket it needs, 12 at most as many
    (fewer on the GPU bench's shape: docs/rollout.md; tests/rollout/test_graphs.py checks the rule step by step)."""
    out = bench(capsys, "decode_buckets", "--prompts", "8", "--n", "4", "--max_tokens", "64", "--slots", "16", "--capture_after", "1,12")
    rows = [[int(float(x)) for x in r] for r in re.findall(r"^\s+16\s+(\d+)\s+[\d.]+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.MULTILINE)]
    assert [r[0] for r in rows] == [1, 12], out
    (_, prefills, steps, buckets, captures, _), (_, _, _, buckets_12, captures_12, _) = rows
    assert prefills > 1 and steps >= 64 and captures == buckets >= 2 and 1 <= captures_12 <= buckets_12, out


@pytest.mark.slow
def test_rollout_benchmark_prints_both_length_cases_against_hf_generate(capsys):
    out = bench(capsys, "rollout", "--prompts", "4", "--max_tokens", "16", "--reps", "1")
    rows = re.findall(r"^(skewed|uniform)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+([\d.]+)x$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["skewed", "uniform"] and float(rows[1][1]) == 16.0, out  # uniform: every row to the limit
    assert float(rows[0][1]) < 16.0, out  # skewed: most rows stop early


@pytest.mark.slow
def test_gpu_step_benchmark_runs_a_family_through_every_mode_on_cpu(tmp_path, capsys, ray_cluster):
    """bench/gpu_step.py is for GPUs; on CPU with a tiny Qwen3 it must still compose verl's GPU defaults, train, and
    print a row per run plus the packed/padded update ratio (its figures are not asserted)."""
    args = ["--device", "cpu", "--dtype", "float32", "--models", "tiny-qwen3", "--engines", "fsdp2", "--modes", "padded,packed",
            "--steps", "2", "--prompts", "4", "--n", "2", "--response-length", "8", "--out", str(tmp_path)]
    out = bench(capsys, "gpu_step", *args)
    rows = re.findall(r"^tiny-qwen3 fsdp2 (padded|packed) native\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["padded", "packed"] and all(float(r[6]) > 0 for r in rows), out  # the step's seconds
    assert re.search(r"^tiny-qwen3 fsdp2 native: packed/padded update time [\d.]+x$", out, re.MULTILINE), out


def test_ulysses_memory_benchmark_prints_both_sizes_and_sp2_holds_less(capsys):
    args = ["--rows", "1", "--tokens", "256", "--hidden", "128", "--layers", "2", "--vocab", "256", "--reps", "1"]
    out = bench(capsys, "ulysses_memory", *args)
    rows = dict(re.findall(r"^sp=(\d)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)x memory", out, re.MULTILINE))
    assert rows.keys() == {"1", "2"} and rows["1"] == "1.00" and float(rows["2"]) < 1.0, out


def test_log_prob_head_benchmark_prints_eager_vs_compiled_and_the_memory_of_full_logits(capsys):
    args = ["--tokens", "64", "--hidden", "64", "--vocab", "1024", "--reps", "1", "--memory-tokens", "512", "--memory-vocab", "8192"]
    out = bench(capsys, "log_prob_head", *args)
    assert re.search(r"eager / compiled = [\d.]+x \(compile once per process: [\d.]+ s\)", out), out
    full, chunked = (float(x) for x in re.findall(r"^  (?:full|rlcore).*?([\d.]+) GiB", out, re.MULTILINE))
    assert full > chunked > 0, out


# The two training benchmarks (~1.5 min each on 2 cores: three or two short runs through Ray) run in the demo lane
# (`make test-demos`); `make test` covers the modes they time in tests/e2e/test_tiny_async.py and
# tests/rollout/test_partial_rollout.py.
@pytest.mark.demo
def test_async_training_benchmark_runs_the_three_modes_at_equal_samples(tmp_path, capsys, ray_cluster):
    args = ["--steps", "2", "--val", "8", "--plot", str(tmp_path / "curves.png")]
    out = bench(capsys, "async_training", *args)
    rows = re.findall(r"^(synchronous|one-step-off|fully async).*?\s([\d.]+)x\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["synchronous", "one-step-off", "fully async"], out
    assert rows[0][1] == "1.00" and rows[0][5] == "0" and int(rows[1][5]) <= 1 and int(rows[2][5]) <= 2, out  # staleness max
    assert (tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.demo
def test_partial_rollout_benchmark_compares_waiting_and_interrupting_syncs(tmp_path, capsys, ray_cluster):
    """One-step-off for 3 steps with 48-token responses (generation slower than training, so each sync lands while
    the rollout generates), with and without partial rollouts. With them the running rows are resumed under the new
    weights (each keeps its 48-token budget) and the sync does not wait; without, none is resumed and the sync waits
    for the batch in flight. Staleness stays within one version either way."""
    out = bench(capsys, "partial_rollout", "--steps", "3", "--modes", "one-step-off", "--out", str(tmp_path / "r.json"))
    rows = re.findall(r"^one-step-off, partial_rollout=(True|False)\s+[\d.]+\s+([\d.]+)x\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s.*/ (\d+)$",
                      out, re.MULTILINE)
    assert [r[0] for r in rows] == ["False", "True"] and rows[0][1] == "1.00", out
    (_, _, waited, resumed_without, stale_without), (_, _, interrupted, resumed_with, stale_with) = rows
    assert float(resumed_without) == 0 < float(resumed_with), out
    assert float(interrupted) < 0.01 and float(waited) > 0.001, out
    assert int(stale_without) <= 1 and int(stale_with) <= 1, out
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert all(r["response_length"] == 48 for r in results.values()), results


def test_model_families_benchmark_prints_each_familys_differences_to_hf(capsys):
    out = bench(capsys, "model_families", "tiny-gemma2")
    row = re.search(r"\| tiny-gemma2 \| ([\d.e+-]+) / ([\d.e+-]+) \| ([\d.e+-]+) / ([\d.e+-]+) \| ([\d.e+-]+) \|", out)
    assert row and all(float(x) < 1e-4 for x in row.groups()), out


@pytest.mark.demo
def test_the_gpu_session_runs_every_stage_dry_on_cpu(tmp_path, ray_cluster):
    """bench/gpu_session.sh, the one script a GPU loan runs, with GPU_SESSION_DRY=1: each stage's command on this CPU
    with tiny shapes (gpu_step.py's baseline and its variants, vs_trl.py without TRL, the MoE decode, the GPU tests'
    command lines), so the 15 minutes of a loan are never spent on a broken stage. Its runs join the pytest run's Ray
    cluster. In the demo lane (`make test-demos`, ~2.5 min on 2 cores: a process per stage): run it before a loan;
    `make test` runs each script in this process above."""
    import ray

    env = {**os.environ, "GPU_SESSION_DRY": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "TEST_DURATIONS_FILE": str(tmp_path / "inner_durations.json")}
    subprocess.run(["bash", str(BENCH / "gpu_session.sh"), "900"], cwd=BENCH.parent, env=env, check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    summary = (tmp_path / "summary.txt").read_text()
    assert re.findall(r"^== (\w+): exit (\d+)", summary, re.MULTILINE) == [
        ("step", "0"), ("step", "0"), ("gpu_tests", "0"), ("trl", "0"), ("moe", "0"), ("gpu_tests", "0")], summary
    assert "== vllm_tests: skipped, no vLLM kit" in summary, summary
    # vs_trl.py: the FLOP bound of the CPU spec (~64 GFLOP of forward + backward) and rlcore's step with its phases.
    trl = (tmp_path / "trl.log").read_text()
    bound = re.search(r"beta 0.001: FLOP-bound minimum \(update ([\d.]+) \+ sampling ([\d.]+) \+ reference ([\d.]+)\)", trl)
    assert bound and float(bound.group(1)) == pytest.approx(3 * float(bound.group(2)), abs=0.2) and 60 < float(bound.group(1)) < 70, trl
    step = re.search(r"rlcore\s+([\d.]+) s/step .*gen [\d.]+.*ref [\d.]+.*update_actor [\d.]+", trl)
    assert step and float(step.group(1)) > 0, trl
    assert json.loads(re.search(r"^rlcore run: (.*)$", trl, re.MULTILINE).group(1))["mean_length"] > 0, trl
    # gpu_step.py: verl's GPU defaults, then the same with every lever (an engine that never sleeps among them), each
    # a row with the step's seconds and the rollout's prefills (CPU: eager, no graph captures).
    runs = {}
    for name in ("step.json", "step_levers.json"):
        runs.update(json.loads((tmp_path / name).read_text())["runs"])
    assert sorted(runs) == ["tiny-qwen3 fsdp2 packed native", "tiny-qwen3 fsdp2 packed native levers"], runs
    assert all(r["step"] > 0 and r["update_actor"] > 0 and r["gen_tokens_per_s"] > 0 and r["prefills"] >= 1 for r in runs.values()), runs
    # moe_rollout.py: greedy rows equal HF's and log-probs the training forward's (fp32: exact), with and without R3.
    moe = (tmp_path / "moe.log").read_text()
    parity = re.findall(r"greedy rows equal to HF generate ([\d.]+), .* max \|log-prob - training forward\| ([\d.e+-]+)", moe)
    assert len(parity) == 2 and all(float(rows) == 1.0 and float(diff) < 1e-4 for rows, diff in parity), moe
    assert len(re.findall(r"^(skewed|uniform)\s+[\d.]+\s+\d+\s+\d+\s+\d+\s+[\d.]+x$", moe, re.MULTILINE)) == 2, moe
