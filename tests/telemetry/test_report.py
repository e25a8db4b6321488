"""The utilisation report and rlcore-report, on a run directory written by hand (shares computed by hand)."""

import json

import pytest

from rlcore.cli.report import main as report_main
from rlcore.telemetry.report import format_report, levers, load_run, summarise

SETTINGS = {"data.train_batch_size": 32, "actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.3, "actor_rollout_ref.rollout.max_num_seqs": 16,
            "trainer.balance_batch": True, "actor_rollout_ref.actor.use_dynamic_bsz": False, "trainer.test_freq": 1,
            "trainer.save_freq": 2, "reward_model.score_workers": 2}


def step_row(step, **extra):
    return {"step": step, "timing_s/step": 1.0, "timing_s/gen": 0.5, "timing_s/update_weights": 0.05, "timing_s/reward": 0.15,
            "timing_s/adv": 0.05, "timing_s/update_actor": 0.25, "timing_s/testing": 0.5, "rollout/kv_slots": 16,
            "rollout/prefills": 8, "perf/gflops_per_device/gen": 2.0, **extra}


def ranks_row(step):
    return {"step": step, "wall_s": 1.65, "phases": {
        "gen": {"busy_s": [0.4, 0.3], "late_s": [0.02, 0.04], "wait_s": [0.0, 0.1], "return_s": 0.01, "roles": ["actor_rollout"]},
        "update_actor": {"busy_s": [0.2, 0.2], "late_s": [0.0, 0.0], "wait_s": [0.0, 0.0], "return_s": 0.02, "roles": ["actor_rollout"]}}}


@pytest.fixture
def run_dir(tmp_path):
    rows = [{"step": 0, "val-core/tiny_add/reward/mean@1": 0.2},
            step_row(1, **{"timing_s/step": 30.0}),  # warm-up: left out
            step_row(2), step_row(3, **{"timing_s/save_checkpoint": 0.3})]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "ranks.jsonl").write_text("".join(json.dumps(ranks_row(s)) + "\n" for s in (1, 2, 3)))
    (tmp_path / "perf.json").write_text(json.dumps({"peak_flops": 4e9, "peak_source": "measured fp32 GEMM on rank 0 (1 thread)",
                                                    "device": "cpu", "world_size": 2, "model": {}, "settings": SETTINGS}))
    return tmp_path


def test_shares_of_the_steady_state_steps(run_dir):
    rows, ranks, facts = load_run(str(run_dir))
    s = summarise(rows, ranks)
    assert s.steps == [2, 3] and s.wall_s == pytest.approx(1.65)  # step + validation + half a checkpoint per step
    # Dispatch moves out of the phases: gen's is its ranks' mean lateness 0.03 + 0.01 back; the update's 0.02 back.
    expected = {"gen": 0.5 - 0.04 - 0.05, "weight sync": 0.05, "reward": 0.15, "advantages": 0.05, "update actor": 0.23,
                "dispatch/transfer": 0.06, "other": 0.05, "validation": 0.5, "checkpoint": 0.15}
    assert s.seconds == pytest.approx(expected)
    assert s.shares == pytest.approx({k: v / 1.65 for k, v in expected.items()})
    assert sum(s.shares.values()) == pytest.approx(1.0)
    assert s.flops == {"gen": pytest.approx(2e9)}
    assert s.ranks[0] == pytest.approx({"busy": 1.2 / 3.3, "late": 0.04 / 3.3, "wait": 0.0, "idle": 1 - 1.24 / 3.3})
    assert s.ranks[1]["wait"] == pytest.approx(0.2 / 3.3)
    assert s.rollout == {"kv_slots": 16, "prefills": 8} and s.saves == 1


def test_levers_fire_on_their_figures_largest_first(run_dir):
    rows, ranks, facts = load_run(str(run_dir))
    found = levers(summarise(rows, ranks), facts)
    assert [round(size, 4) for size, _ in found] == [round(0.5 / 1.65, 4), round(0.41 / 1.65 * 7 / 8, 4)]
    assert found[0][1] == "validation is 30% of the run (trainer.test_freq=1): raise trainer.test_freq or set data.val_max_samples"
    assert found[1][1].startswith("the KV cache holds 16 sequences per replica, so each replica's 128 samples ran in 8 waves "
                                  "(generation is 25% of the step): raise actor_rollout_ref.rollout.gpu_memory_utilization (now 0.3)")
    # Not fired: the checkpoint (one save, the final one every run makes), waiting (3%), dispatch (4%), reward (9%).


def test_a_small_rollout_batch_and_a_waiting_rank_are_named():
    from rlcore.telemetry.report import Summary

    s = Summary([2], 1.0, {"gen": 0.71, "update actor": 0.29}, {}, ranks=[{"busy": 0.5, "late": 0.0, "wait": 0.38, "idle": 0.12}] * 2)
    facts = {"world_size": 8, "settings": {**SETTINGS, "actor_rollout_ref.rollout.tensor_model_parallel_size": 2, "trainer.balance_batch": False}}
    texts = [text for _, text in levers(s, facts)]
    assert texts[0].startswith("generation is 71% of the step and the rollout batch is 64 samples per replica (32 prompts x "
                               "rollout.n=8 over 4 replicas)") and texts[0].endswith("raise data.train_batch_size or actor_rollout_ref.rollout.n")
    assert texts[1] == "ranks wait 38% of the step for the slowest rank: enable trainer.balance_batch"


def test_decode_graph_captures_name_free_cache_engine():
    """A rollout that captures its decode graphs again after every sleep (the H200 bench's shape: 31 captures a step)."""
    from rlcore.telemetry.report import Summary

    s = Summary([2], 8.0, {"gen": 0.7, "update actor": 0.3}, {}, rollout={"graph_capture_s": 1.6})
    [(share, text)] = levers(s, {"world_size": 1, "settings": {}})
    assert share == pytest.approx(0.2) and text.startswith("capturing the rollout's decode graphs takes 20% of the step (1.60 s): "
                                                           "set actor_rollout_ref.rollout.free_cache_engine=False where")
    [(_, text)] = levers(s, {"world_size": 1, "settings": {"actor_rollout_ref.rollout.free_cache_engine": False,
                                                           "actor_rollout_ref.rollout.cudagraph_capture_sizes": [1, 8, 64]}})
    assert text.endswith("(1.60 s): list fewer actor_rollout_ref.rollout.cudagraph_capture_sizes (now [1, 8, 64])")
    assert levers(Summary([2], 8.0, {}, {}, rollout={"graph_capture_s": 0.3}), {"settings": {}}) == []  # 4%: not fired


def test_the_report_and_the_cli(run_dir, capsys):
    text = format_report(str(run_dir))
    assert text.splitlines()[1] == "devices: 2 x cpu, peak 4.0 GFLOP/s per device (measured fp32 GEMM on rank 0 (1 thread))"
    assert "gen                 24.8%    0.410    2.0 GFLOP/s  50.0%  generation on the workers" in text
    assert "  rank 1   busy  30.3%  late   2.4%  waiting   6.1%  idle  61.2%" in text
    assert "largest lever: validation is 30% of the run" in text and "then: the KV cache holds 16" in text
    assert report_main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("utilisation report:") and f"plots: {run_dir}/plots.png" in out and (run_dir / "plots.png").stat().st_size > 10_000
    assert report_main(["--peaks"]) == 0 and "H100 PCIe      756.0 TFLOP/s" in capsys.readouterr().out
    assert report_main([str(run_dir / "missing")]) == 2
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.5}) + "\n")  # an rlcore-sft run
    assert report_main([str(run_dir)]) == 0 and "no PPO step timings" in capsys.readouterr().out
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val-core/x/reward/mean@1": 0.5}) + "\n")
    assert report_main([str(run_dir)]) == 1 and "no training step yet" in capsys.readouterr().err


def test_the_memory_ledger_of_the_last_step_beside_the_plan(tmp_path):
    ledger = {"perf/memory/generate/params_gib": 0.0, "perf/memory/generate/kv_cache_gib": 1.5, "perf/memory/generate/transient_gib": 0.5,
              "perf/memory/update_actor/params_gib": 2.0, "perf/memory/update_actor/optimizer_gib": 4.0}
    rows = [step_row(1), step_row(2, **{"training/global_step": 2}, **ledger)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "perf.json").write_text(json.dumps({"peak_flops": 4e9, "peak_source": "measured", "device": "cpu", "world_size": 2,
                                                    "model": {}, "settings": SETTINGS, "memory_plan": {"generate": 40.25}}))
    lines = format_report(str(tmp_path)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("memory per phase"))
    assert "at step 2" in lines[start]
    assert lines[start + 1].split() == ["phase", "params", "optimizer", "kv_cache", "transient", "plan"]
    assert lines[start + 2].split() == ["generate", "0.000", "-", "1.500", "0.500", "40.25"]
    assert lines[start + 3].split() == ["update_actor", "2.000", "4.000", "-", "-", "-"]
