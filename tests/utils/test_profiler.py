"""A worker's profiler (rlcore.utils.profiler): which ranks write, what each trace holds, one trace per call when
discrete, and the CUDA-only tools' calls (torch_memory, nsys) checked against torch's API with the device faked."""

import json
import os

import pytest
import torch

from rlcore.utils.profiler import ProfileSpec, WorkerProfiler


def spec(tmp_path, **kw):
    return ProfileSpec(**{"tool": "torch", "save_dir": str(tmp_path / "step_2"), "group": "actor_rollout", "ranks": [0], **kw})


def events(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def work():
    torch.ones(64, 64) @ torch.ones(64, 64)


def test_a_step_trace_holds_each_call_as_a_range_and_its_ops(tmp_path):
    profiler = WorkerProfiler(0, "cpu")
    profiler.start(spec(tmp_path, contents=["cpu", "shapes"]))
    for method in ("generate_sequences", "update_actor"):
        with profiler.call(method):
            work()
    written = profiler.stop()
    assert written == [str(tmp_path / "step_2" / "actor_rollout_rank0.pt.trace.json")]
    names = {e.get("name") for e in events(written[0])}
    assert {"generate_sequences", "update_actor", "aten::mm"} <= names
    assert any("Input Dims" in e.get("args", {}) for e in events(written[0]) if e.get("name") == "aten::mm")  # shapes
    with profiler.call("after_the_step"):  # stopped: nothing more is written
        work()
    assert profiler.stop() == [] and os.listdir(tmp_path / "step_2") == ["actor_rollout_rank0.pt.trace.json"]


def test_only_the_ranks_asked_for_write(tmp_path):
    other = WorkerProfiler(1, "cpu")
    other.start(spec(tmp_path))  # ranks [0]
    with other.call("update_actor"):
        work()
    assert other.stop() == [] and not (tmp_path / "step_2").exists()
    every = WorkerProfiler(1, "cpu")
    every.start(spec(tmp_path, ranks=None))  # all_ranks
    with every.call("update_actor"):
        work()
    assert every.stop() == [str(tmp_path / "step_2" / "actor_rollout_rank1.pt.trace.json")]


def test_discrete_writes_one_trace_per_call(tmp_path):
    profiler = WorkerProfiler(0, "cpu")
    profiler.start(spec(tmp_path, discrete=True))
    for method in ("compute_log_prob", "update_actor", "compute_log_prob"):
        with profiler.call(method):
            work()
    written = [os.path.basename(p) for p in profiler.stop()]
    assert written == ["actor_rollout_rank0_compute_log_prob.pt.trace.json", "actor_rollout_rank0_update_actor.pt.trace.json",
                       "actor_rollout_rank0_compute_log_prob_2.pt.trace.json"]
    names = {e.get("name") for e in events(tmp_path / "step_2" / written[1])}
    assert "update_actor" in names and "compute_log_prob" not in names


def test_torch_memory_records_the_allocator_history_with_the_options(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(("record", a, k)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: calls.append(("dump", path)))
    profiler = WorkerProfiler(0, "cuda")
    profiler.start(spec(tmp_path, tool="torch_memory", max_entries=500, stacks="python", context="alloc",
                        memory_kwargs={"clear_history": True}))
    written = profiler.stop()
    path = str(tmp_path / "step_2" / "actor_rollout_rank0.pickle")
    assert written == [path]
    assert calls == [("record", (), {"max_entries": 500, "stacks": "python", "context": "alloc", "clear_history": True}),
                     ("dump", path), ("record", (), {"enabled": None})]


@pytest.mark.parametrize("discrete, expected", [(False, ["start", "stop"]), (True, ["start", "stop", "start", "stop"])])
def test_nsys_opens_the_capture_range_per_step_or_per_call(tmp_path, monkeypatch, discrete, expected):
    seen = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: seen.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: seen.append("stop"))
    profiler = WorkerProfiler(0, "cuda")
    profiler.start(spec(tmp_path, tool="nsys", discrete=discrete))
    for method in ("generate_sequences", "update_actor"):
        with profiler.call(method):
            pass
    assert profiler.stop() == [] and seen == expected  # Nsight writes its own report when the process exits
