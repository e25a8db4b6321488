"""Profiling with verl's keys (rlcore.trainer.profiling): which group profiles which ranks on which steps, in which
folder; Nsight's options for the groups it runs; and a tiny run through Ray whose step-2 trace holds its calls."""

import json
import os

import pytest
from e2e_utils import tiny_cfg

from rlcore.config import compose
from rlcore.config.schema import PPOConfig
from rlcore.config.typed import typed
from rlcore.trainer.profiling import Profiling, group_specs, nsight_runtime_env

ACTOR, ROLLOUT, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


class FakeGroup:
    def __init__(self, log):
        self.log = log

    def start_profile(self, spec):
        self.log.append(("start", spec.group, os.path.basename(spec.save_dir), spec.ranks))

    def stop_profile(self):
        self.log.append(("stop",))
        return [["a.pt.trace.json"], []]  # one list per rank


def test_each_group_profiles_the_ranks_its_roles_ask_for():
    cfg = compose(["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{ACTOR}.profiler.enable=True",
                   f"{ACTOR}.profiler.ranks=[1]", f"{REF}.profiler.enable=True", f"{REF}.profiler.ranks=[3]",
                   "critic.profiler.enable=True", "critic.profiler.all_ranks=True",
                   f"{ACTOR}.profiler.tool_config.torch.discrete=True"])
    groups = {"actor_rollout": None, "critic": None}
    specs = group_specs(cfg, groups, "step_1")
    # the rollout follows the actor (ranks [1]); the reference adds rank 3 to the same process group
    assert specs["actor_rollout"].ranks == [1, 3] and specs["actor_rollout"].discrete
    assert specs["critic"].ranks is None and not specs["critic"].discrete
    assert "reward_model" not in specs  # not enabled (and not built)
    # rank 0 when enabled without ranks; with split pools the rollout's own group answers for the rollout
    cfg = compose(["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{ROLLOUT}.profiler.enable=True"])
    assert group_specs(cfg, {"actor_rollout": None}, "step_1")["actor_rollout"].ranks == [0]
    assert set(group_specs(cfg, {"actor_rollout": None, "rollout": None}, "step_1")) == {"rollout"}


def test_the_tool_options_and_folders_reach_every_profiled_group():
    cfg = compose(["global_profiler.tool=torch_memory", "global_profiler.steps=[1]", "global_profiler.save_path=/runs/prof",
                   f"{ACTOR}.profiler.enable=True", "critic.profiler.enable=True", "critic.profiler.save_path=/runs/critic",
                   "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=500",
                   "global_profiler.global_tool_config.torch_memory.context=alloc",
                   "global_profiler.global_tool_config.torch_memory.stacks=python",
                   "+global_profiler.global_tool_config.torch_memory.kw_args.clear_history=true"])
    specs = group_specs(cfg, {"actor_rollout": None, "critic": None}, "step_1")
    actor = specs["actor_rollout"]
    assert (actor.tool, actor.max_entries, actor.context, actor.stacks, actor.memory_kwargs) == (
        "torch_memory", 500, "alloc", "python", {"clear_history": True})
    assert actor.save_dir == "/runs/prof/step_1" and specs["critic"].save_dir == "/runs/critic/step_1"  # a role's save_path
    nsys = compose(["global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.profiler.enable=True",
                    "global_profiler.global_tool_config.nsys.discrete=True"])
    assert group_specs(nsys, {"actor_rollout": None}, "step_1")["actor_rollout"].discrete  # a capture range per call


@pytest.mark.parametrize("continuous, expected", [
    (False, [("start", "actor_rollout", "step_2", [0]), ("stop",), ("start", "actor_rollout", "step_3", [0]), ("stop",)]),
    (True, [("start", "actor_rollout", "steps_2-3", [0]), ("stop",)]),
])
def test_listed_steps_are_profiled_one_by_one_or_as_one_run(continuous, expected, capsys):
    log = []
    cfg = compose(["global_profiler.tool=torch", "global_profiler.steps=[2,3]", f"{ACTOR}.profiler.enable=True",
                   f"global_profiler.profile_continuous_steps={continuous}"])
    profiling = Profiling(cfg, {"actor_rollout": FakeGroup(log)})
    for step in (1, 2, 3, 4):
        with profiling.step(step):
            log.append(("step", step)) if step in (1, 4) else None
    assert [e for e in log if e[0] != "step"] == expected
    assert log[0] == ("step", 1) and log[-1] == ("step", 4)  # steps 1 and 4 run outside any profile
    assert "rlcore: profile: 1 file(s) in" in capsys.readouterr().out


def test_no_tool_or_no_enabled_role_profiles_nothing():
    log = []
    for overrides in (["global_profiler.steps=[1]", f"{ACTOR}.profiler.enable=True"], ["global_profiler.tool=torch", "global_profiler.steps=[1]"]):
        with Profiling(compose(overrides), {"actor_rollout": FakeGroup(log)}).step(1):
            pass
    assert log == []


def test_nsys_runs_the_profiled_groups_under_nsight_with_the_worker_options():
    cfg = compose(["global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.profiler.enable=True",
                   "+global_profiler.global_tool_config.nsys.worker_nsight_options.sample=none"])
    config = typed(cfg, PPOConfig)  # what the controller hands build_groups
    assert nsight_runtime_env(config, "actor_rollout") == {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph",
        "capture-range": "cudaProfilerApi", "kill": "none", "sample": "none"}  # capture-range-end: null is left out
    assert nsight_runtime_env(config, "critic") is None  # the critic is not profiled
    torch_cfg = typed(compose([f"{ACTOR}.profiler.enable=True", "global_profiler.tool=torch"]), PPOConfig)
    assert nsight_runtime_env(torch_cfg, "actor_rollout") is None


@pytest.mark.usefixtures("ray_cluster")
def test_a_tiny_runs_step_two_trace_holds_its_calls_on_rank_zero_only(tiny_model_dir, tiny_task_dir, tmp_path):
    from rlcore.train import run

    save = tmp_path / "profile"
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=-1",
                   "trainer.test_freq=-1", "global_profiler.tool=torch", "global_profiler.steps=[2]",
                   f"global_profiler.save_path={save}", f"{ACTOR}.profiler.enable=True")
    run(cfg, str(tmp_path / "run"))
    assert os.listdir(save) == ["step_2"] and os.listdir(save / "step_2") == ["actor_rollout_rank0.pt.trace.json"]
    with open(save / "step_2" / "actor_rollout_rank0.pt.trace.json") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"generate_sequences", "update_actor"} <= names and "aten::mm" in names
