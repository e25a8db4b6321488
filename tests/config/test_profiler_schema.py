"""Profiling settings that cannot profile anything are refused before Ray starts, each naming its key and a fix."""

import pytest

from rlcore.cli.preflight import preflight
from rlcore.config import compose
from rlcore.config.validate import diagnose

GP, ACTOR = "global_profiler", "actor_rollout_ref.actor.profiler"
ON = ["recipe=tiny_cpu", f"{GP}.tool=torch", f"{GP}.steps=[2]", f"{ACTOR}.enable=True"]


def errors(*overrides):
    return [e for e in diagnose(compose(list(overrides)))[1] if "profiler" in e]


def test_a_torch_profile_of_the_actor_is_valid():
    assert errors(*ON) == []
    # a tool with no role asking for it profiles nothing and is accepted, as verl's scripts set it
    assert errors(f"{GP}.tool=torch_memory", "trainer.device=cuda") == []


def test_a_role_enabled_with_no_step_is_warned_and_runs_unprofiled_as_in_verl():
    from rlcore.config.profiler_schema import profiler_warnings

    cfg = compose([*ON, f"{GP}.steps=null"])
    assert errors(*ON, f"{GP}.steps=null") == []
    assert profiler_warnings(cfg) == [f"{ACTOR}.enable=True profiles the steps in {GP}.steps, which is empty: nothing is "
                                      f"profiled (as in verl); set e.g. {GP}.steps=[2,3]"]
    assert profiler_warnings(compose(ON)) == []


@pytest.mark.parametrize("overrides, message", [
    ([f"{ACTOR}.enable=True"], f"{ACTOR}.enable=True but global_profiler.tool is null: nothing would be profiled; set {GP}.tool=torch"),
    ([*ON, f"{GP}.steps=[0]"], f"{GP}.steps=[0] must list global steps, counted from 1"),
    ([*ON, f"{GP}.tool=npu"], f"{GP}.tool=npu profiles Ascend NPUs, which rlcore does not run on; use {GP}.tool=torch"),
    ([*ON, f"{GP}.tool=torch_memory"], f"{GP}.tool=torch_memory records the CUDA caching allocator, and trainer.device=cpu has none"),
    ([*ON, f"{GP}.tool=nsys"], f"{GP}.tool=nsys records the CUDA kernels, and trainer.device=cpu has none"),
    ([*ON, f"{ACTOR}.tool_config.torch.contents=[cpu,flops]"], f"{ACTOR}.tool_config.torch.contents=['cpu', 'flops']: ['flops'] not among"),
    ([*ON, f"{ACTOR}.ranks=[-1]"], f"{ACTOR}.ranks=[-1] must list ranks of the role's worker group, from 0"),
    ([*ON, "actor_rollout_ref.ref.profiler.enable=True", "actor_rollout_ref.ref.profiler.save_path=/elsewhere"],
     "the actor, reference and rollout run in one process, which one profiler with one save_path serves"),
])
def test_what_cannot_profile_is_refused_with_the_fix(overrides, message):
    assert any(message in e for e in errors(*overrides)), errors(*overrides)


def test_nsys_must_be_installed_where_the_job_runs(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    cfg = compose([*ON, f"{GP}.tool=nsys", "trainer.device=cuda"])
    assert preflight(cfg, "plan").errors[-1] == (f"{GP}.tool=nsys: Nsight Systems is not installed (no nsys on PATH); install "
                                                 f"Nsight Systems (nsys on PATH) on every node that runs the job, or use {GP}.tool=torch")
    assert any(w.startswith(f"{GP}.tool=nsys: Nsight Systems is not installed") for w in preflight(cfg, "elsewhere").warnings)
