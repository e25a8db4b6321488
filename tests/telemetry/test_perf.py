"""Per-phase, per-rank step accounting and the FLOP counts (rlcore.telemetry.perf), on hand-made group calls."""

import json
from types import SimpleNamespace

import pytest
import torch

from rlcore.controller.ray_group import GroupCall
from rlcore.protocol import DataProto
from rlcore.telemetry.perf import StepPerf, forward_flops
from rlcore.utils.device import measure_gemm_flops, nominal_peak_flops


class FakeGroup:
    """What StepPerf reads of a RayWorkerGroup: its pool and the calls it recorded."""

    def __init__(self, pool):
        self.pool, self.calls, self.record_calls = pool, [], False

    def drain_calls(self):
        calls, self.calls = self.calls, []
        return calls


SHAPE = {"body": 1000, "head": 100, "layers": 2, "attn_width": 8}


# Two sequences of 3 and 5 valid tokens, of which 2 and 3 are the response's.
BATCH = DataProto.from_dict({"attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
                             "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])})


def make_perf(tmp_path, **groups):
    return StepPerf(groups, str(tmp_path), {"actor": SHAPE}, peak_flops=1e9, update_passes={"update_actor": 4})


def test_a_call_splits_into_busy_late_waiting_and_return(tmp_path):
    actor, elsewhere = FakeGroup(pool="main"), FakeGroup(pool="other")
    perf = make_perf(tmp_path, actor_rollout=actor, reward_model=elsewhere)
    assert actor.record_calls and elsewhere.record_calls
    actor.calls.append(GroupCall("init_model", 9.0, [9.0, 9.0], [0.0, 0.0]))  # outside any phase: no step's
    metrics = {}
    with perf.phase("gen", metrics):
        # rank 0 started 0.1 s after the send and worked 0.5 s; rank 1 started at once and worked 0.8 s; the
        # results were back 1.0 s after the send.
        actor.calls.append(GroupCall("generate_sequences", 1.0, [0.5, 0.8], [0.1, 0.0]))
        elsewhere.calls.append(GroupCall("compute_rm_score", 5.0, [5.0], [0.0]))  # its own devices: not counted
    assert metrics["timing_s/gen"] >= 0
    metrics.update({"timing_s/step": 2.0, "timing_s/gen": 0.5, "timing_s/update_weights": 0.1})
    perf.count_tokens(BATCH)
    out = perf.end_step(7, metrics)
    # busy: mean(0.5, 0.8) = 0.65 of 2 s; waiting: rank 0 finished at 0.6, the slowest at 0.8 -> mean 0.1;
    # dispatch: mean lateness 0.05 + 0.2 s back = 0.25; the controller the rest.
    assert out["perf/device_busy_share"] == pytest.approx(0.325)
    assert out["perf/wait_slowest_share"] == pytest.approx(0.05)
    assert out["perf/dispatch_share"] == pytest.approx(0.125)
    assert out["perf/controller_share"] == pytest.approx(0.5)
    row = json.loads((tmp_path / "ranks.jsonl").read_text())
    assert row["step"] == 7 and row["wall_s"] == 2.0 and list(row["phases"]) == ["gen"]
    gen = row["phases"]["gen"]
    assert gen["busy_s"] == [0.5, 0.8] and gen["late_s"] == [0.1, 0.0] and gen["roles"] == ["actor_rollout"]
    assert gen["wait_s"] == pytest.approx([0.2, 0.0]) and gen["return_s"] == pytest.approx(0.2)
    # Generation's FLOPs: sequences of 3 and 5 tokens through 1000 block weights and 2 layers of width 8, the 100
    # head weights for the 5 response tokens only, over generation's 0.15 s of compute (0.5 s, minus the 0.1 s
    # weight sync, minus the 0.25 s dispatch and transfer), on 2 devices.
    flops = 2 * 1000 * 8 + 2 * 100 * 5 + 2 * 2 * 8 * (3 * 3 + 5 * 5)
    assert forward_flops(SHAPE, [3, 5], 5) == flops == 18088
    assert out["perf/gflops_per_device/gen"] == pytest.approx(flops / 0.15 / 2 / 1e9)
    assert out["perf/mfu/gen"] == pytest.approx(flops / 0.15 / 2 / 1e9)  # peak 1 GFLOP/s
    assert perf.end_step(8, {"timing_s/step": 1.0}) == {}  # nothing recorded: nothing claimed


def test_an_update_counts_its_forward_pass_equivalents(tmp_path):
    actor = FakeGroup(pool="main")
    perf = make_perf(tmp_path, actor_rollout=actor)
    metrics = {}
    with perf.phase("update_actor", metrics):
        actor.calls.append(GroupCall("update_actor", 1.0, [1.0, 1.0], [0.0, 0.0]))
    perf.count_tokens(BATCH)
    metrics.update({"timing_s/step": 1.0, "timing_s/update_actor": 1.0})
    out = perf.end_step(1, metrics)
    assert out["perf/gflops_per_device/update_actor"] == pytest.approx(4 * 18088 / 1.0 / 2 / 1e9)  # the passes given (4 here)
    assert out["perf/device_busy_share"] == 1.0 and out["perf/controller_share"] == 0.0


def test_test_doubles_without_recorded_calls_are_left_alone(tmp_path):
    perf = StepPerf({"actor_rollout": SimpleNamespace(world_size=2)}, None, None, None, {})
    metrics = {}
    with perf.phase("gen", metrics):
        pass
    assert perf.end_step(1, {**metrics, "timing_s/step": 1.0}) == {}


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.1), ("NVIDIA L4", 121.0), ("NVIDIA H200", 989.4), ("AMD Instinct MI300X", 1307.4),
])
def test_nominal_peaks_match_the_longest_device_name(name, tflops):
    assert nominal_peak_flops(name) == pytest.approx(tflops * 1e12)


def test_unknown_devices_have_no_nominal_peak_and_cpu_peaks_are_measured():
    assert nominal_peak_flops("Some Future GPU") is None
    measured = measure_gemm_flops(torch.device("cpu"), torch.float32, 256, reps=2)
    assert 1e8 < measured < 1e13  # any x86 core does 0.1 GFLOP/s; none of 2 cores does 10 TFLOP/s


@pytest.mark.parametrize("checkpointing", [True, False])
def test_mfu_counts_forward_and_backward_whether_or_not_the_forward_is_recomputed(monkeypatch, checkpointing):
    """PaLM's MFU: the model's FLOPs per second, 3 forward passes per epoch of an update. Counting the forward that
    gradient checkpointing recomputes (4) credited the recomputation as useful work: on an H200 the checkpointed
    update read 11.2% against 10.6% without, while it took 1.58 s against 1.26 s (docs/benchmarks.md)."""
    import ray

    from rlcore.config import compose
    from rlcore.telemetry import perf

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(perf, "model_shapes", lambda cfg, roles: {"actor": SHAPE})
    rank0 = SimpleNamespace(peak_flops=SimpleNamespace(remote=lambda: (1e12, "measured")))
    groups = {"actor_rollout": SimpleNamespace(workers=[rank0], world_size=1)}
    cfg = compose([f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}", "actor_rollout_ref.actor.ppo_epochs=2"])
    step = perf.start_step_perf(cfg, groups, None, {})
    assert step.update_passes["update_actor"] == 6 and step.update_passes["update_critic"] == 3 * cfg.critic.ppo_epochs
