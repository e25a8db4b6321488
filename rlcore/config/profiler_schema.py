"""Profiling with verl's keys: `global_profiler.*` (which tool, which steps, where traces go) and each role's
`profiler.*` (whether it is profiled, on which ranks), as verl cuts them. rlcore/utils/profiler.py does the
profiling in the workers; the rules below refuse what cannot run here, with the reason.

Tools: `torch` (torch.profiler traces, `*.pt.trace.json`, for Perfetto or TensorBoard), `torch_memory` (the CUDA
caching allocator's history, a snapshot for pytorch.org/memory_viz), `nsys` (the workers run under Nsight Systems:
only where `nsys` is installed), `npu` (Ascend: refused). A role's `tool` and `save_path` follow the global ones.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II, OmegaConf

TOOLS = ("torch", "torch_memory", "nsys", "npu")
TORCH_CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")


@dataclass
class NsysToolConfig:
    discrete: bool = False  # one Nsight capture range per worker call instead of one per profiled step


@dataclass
class RoleNsysToolConfig:
    # as global_profiler.global_tool_config.nsys.discrete
    discrete: bool = II("oc.select:global_profiler.global_tool_config.nsys.discrete")


@dataclass
class NpuToolConfig:
    contents: List[str] = field(default_factory=list)  # Ascend profiler contents (tool=npu is refused: no Ascend here)
    level: str = "level0"  # Ascend profiler level
    analysis: bool = True  # Ascend: analyse the trace after the run
    discrete: bool = False  # Ascend: one trace per worker call


@dataclass
class TorchScheduleConfig:
    """verl 0.9's torch.profiler schedule within a profiled step (`<role>.profiler.tool_config.torch.schedule.*`)."""

    skip_first: int = 0  # calls skipped before the schedule starts
    wait: int = 0  # calls idle per cycle
    warmup: int = 0  # calls traced and dropped per cycle
    active: int = 0  # calls recorded per cycle; 0 = every call of the step
    repeat: int = 0  # cycles; 0 = until the step ends


@dataclass
class TorchToolConfig:
    # what the trace records: cpu, cuda (kernels), memory (allocations), shapes, stack; [] = cpu and, on CUDA, cuda
    contents: List[str] = field(default_factory=list)
    discrete: bool = False  # one trace per worker call instead of one per profiled step
    schedule: TorchScheduleConfig = field(default_factory=TorchScheduleConfig)  # verl 0.9's profiler schedule


@dataclass
class TorchMemoryToolConfig:
    # allocator events kept (the oldest are dropped); as the global setting
    trace_alloc_max_entries: int = II("oc.select:global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries,100000")
    # frames kept per allocation's stack; as the global setting
    stack_depth: int = II("oc.select:global_profiler.global_tool_config.torch_memory.stack_depth,32")


@dataclass
class ProfilerToolConfig:
    nsys: RoleNsysToolConfig = field(default_factory=RoleNsysToolConfig)  # tool=nsys
    npu: NpuToolConfig = field(default_factory=NpuToolConfig)  # tool=npu (refused)
    torch: TorchToolConfig = field(default_factory=TorchToolConfig)  # tool=torch
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)  # tool=torch_memory


@dataclass
class ProfilerConfig:
    """One role's profiling (`<role>.profiler.*`): on by `enable`, on `ranks` (rank 0 when empty) or all ranks."""

    tool: Optional[str] = II("oc.select:global_profiler.tool,null")  # as global_profiler.tool
    enable: bool = False  # profile this role on global_profiler.steps
    all_ranks: bool = False  # every rank of the role's worker group
    ranks: List[int] = field(default_factory=list)  # the ranks profiled; [] = rank 0
    save_path: Optional[str] = II("oc.select:global_profiler.save_path,null")  # as global_profiler.save_path
    tool_config: ProfilerToolConfig = field(default_factory=ProfilerToolConfig)  # per-tool options
    # verl 0.9: a command run on the profiled ranks when a trace is written, and moving the results; as the global ones
    finish_hook_cmd: Optional[str] = II("oc.select:global_profiler.finish_hook_cmd,null")
    finish_hook_ranks: List[int] = II("oc.select:global_profiler.finish_hook_ranks,[]")  # the ranks that run it
    finish_hook_all_ranks: bool = II("oc.select:global_profiler.finish_hook_all_ranks,false")  # every profiled rank runs it
    relocate_results: bool = II("oc.select:global_profiler.relocate_results,false")  # move the results after the hook


@dataclass
class RolloutNpuToolConfig(NpuToolConfig):
    profile_token_start: Optional[int] = None  # verl 0.9: start tracing at this decoded token
    profile_token_end: Optional[int] = None  # verl 0.9: stop tracing at this decoded token


@dataclass
class RolloutTorchToolConfig(TorchToolConfig):
    profile_token_start: Optional[int] = None  # verl 0.9: start tracing at this decoded token
    profile_token_end: Optional[int] = None  # verl 0.9: stop tracing at this decoded token


@dataclass
class RolloutToolConfig(ProfilerToolConfig):
    npu: RolloutNpuToolConfig = field(default_factory=RolloutNpuToolConfig)  # tool=npu (refused)
    torch: RolloutTorchToolConfig = field(default_factory=RolloutTorchToolConfig)  # tool=torch


@dataclass
class RolloutProfilerConfig(ProfilerConfig):
    """The rollout's profiling follows the actor's (verl: the same process in the hybrid engine)."""

    enable: bool = II("oc.select:actor_rollout_ref.actor.profiler.enable,false")  # as the actor's
    all_ranks: bool = II("oc.select:actor_rollout_ref.actor.profiler.all_ranks,false")  # as the actor's
    ranks: List[int] = II("oc.select:actor_rollout_ref.actor.profiler.ranks,[]")  # as the actor's
    finish_hook_cmd: Optional[str] = II("oc.select:actor_rollout_ref.actor.profiler.finish_hook_cmd,null")  # as the actor's
    finish_hook_ranks: List[int] = II("oc.select:actor_rollout_ref.actor.profiler.finish_hook_ranks,[]")  # as the actor's
    finish_hook_all_ranks: bool = II("oc.select:actor_rollout_ref.actor.profiler.finish_hook_all_ranks,false")  # as the actor's
    relocate_results: bool = II("oc.select:actor_rollout_ref.actor.profiler.relocate_results,false")  # as the actor's
    tool_config: RolloutToolConfig = field(default_factory=RolloutToolConfig)  # per-tool options


@dataclass
class TorchMemoryGlobalConfig:
    trace_alloc_max_entries: int = 100000  # allocator events kept (the oldest are dropped)
    stack_depth: int = 32  # frames kept per allocation's stack
    context: str = "all"  # which events keep a stack: all | alloc | state (torch.cuda.memory._record_memory_history)
    stacks: str = "all"  # python | all (python and C++ frames)
    kw_args: Dict[str, Any] = field(default_factory=dict)  # more arguments for _record_memory_history


@dataclass
class NsysGlobalConfig:
    discrete: bool = False  # one capture range per worker call instead of one per profiled step
    # nsys options of the controller process (verl's; rlcore does not run the controller under nsys)
    controller_nsight_options: Dict[str, Any] = field(default_factory=lambda: {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": True, "cuda-graph-trace": "graph"})
    # nsys options of each profiled worker process (Ray's runtime_env "nsight")
    worker_nsight_options: Dict[str, Any] = field(default_factory=lambda: {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": True, "cuda-graph-trace": "graph",
        "capture-range": "cudaProfilerApi", "capture-range-end": None, "kill": "none"})


@dataclass
class GlobalToolConfig:
    nsys: NsysGlobalConfig = field(default_factory=NsysGlobalConfig)  # tool=nsys
    torch_memory: TorchMemoryGlobalConfig = field(default_factory=TorchMemoryGlobalConfig)  # tool=torch_memory


@dataclass
class GlobalProfilerConfig:
    """What is profiled and where it goes (`global_profiler.*`)."""

    tool: Optional[str] = None  # torch | torch_memory | nsys | npu; None = no profiling
    steps: Optional[List[int]] = None  # the global steps profiled (1-based); None = none
    profile_continuous_steps: bool = False  # consecutive listed steps go into one trace
    save_path: str = "outputs/profile"  # traces and snapshots go under this directory, one folder per step
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)  # per-tool options
    finish_hook_cmd: Optional[str] = None  # verl 0.9: a command run when a trace is written
    finish_hook_ranks: List[int] = field(default_factory=list)  # verl 0.9: the ranks that run it
    finish_hook_all_ranks: bool = False  # verl 0.9: every profiled rank runs it
    relocate_results: bool = False  # verl 0.9: move the results after the hook


# ---------------------------------------------------------------------------------------------------- rules
# Rules for profiling (`global_profiler.*`, `<role>.profiler.*`): what cannot profile anything is refused before
# Ray starts, naming the key and what to use. `c` is validate's checker (get / error / choice). Whether `nsys` is
# installed is a fact of the machine that runs the job: rlcore.cli.preflight checks it.


GP = "global_profiler"
ROLE_SECTIONS = {"actor_rollout_ref.actor": "actor", "actor_rollout_ref.ref": "ref", "actor_rollout_ref.rollout": "rollout",
                 "critic": "critic", "reward_model": "reward_model"}
HYBRID = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout")  # one process in rlcore


def check_profiler(c) -> None:
    tool = c.cfg.global_profiler.tool
    if tool is not None:
        c.choice(f"{GP}.tool", TOOLS)
    enabled = [s for s in ROLE_SECTIONS if c.get(s).profiler.enable]
    if tool is None:
        if enabled:
            c.error(f"{enabled[0]}.profiler.enable=True but global_profiler.tool is null: nothing would be profiled; set "
                    f"{GP}.tool=torch (and {GP}.steps=[...])")
        return
    if tool == "npu":
        c.error(f"{GP}.tool=npu profiles Ascend NPUs, which rlcore does not run on; use {GP}.tool=torch")
    if tool in ("torch_memory", "nsys") and c.cfg.trainer.device != "cuda":
        c.error(f"{GP}.tool={tool} records the CUDA {'caching allocator' if tool == 'torch_memory' else 'kernels'}, and "
                f"trainer.device={c.cfg.trainer.device} has none; use {GP}.tool=torch (its tool_config.torch.contents="
                "[memory] records allocations on any device)")
    if not enabled:
        return  # a tool and no role asking for it profiles nothing, as in verl (whose scripts set the tool so)
    steps = c.cfg.global_profiler.steps
    if steps and any(not isinstance(s, int) or s < 1 for s in steps):
        c.error(f"{GP}.steps={list(steps)} must list global steps, counted from 1")
    for section in enabled:
        _check_role(c, section)
    # The actor, reference and rollout share a process: one profiler runs there, with one tool and one folder.
    shared = [s for s in HYBRID if s in enabled]
    for key in ("tool", "save_path"):
        values = {s: getattr(c.get(s).profiler, key) for s in shared}
        if len(set(map(str, values.values()))) > 1:
            c.error(f"{', '.join(f'{s}.profiler.{key}={v}' for s, v in values.items())}: the actor, reference and rollout "
                    f"run in one process, which one profiler with one {key} serves; set the same {key} (or leave them to "
                    f"{GP}.{key})")


def profiler_warnings(cfg) -> list[str]:
    """A role asking for the profiler with no step to profile runs unprofiled, as in verl: said before the run."""
    enabled = [s for s in ROLE_SECTIONS if OmegaConf.select(cfg, s).profiler.enable]
    if enabled and cfg.global_profiler.tool is not None and not cfg.global_profiler.steps:
        return [f"{enabled[0]}.profiler.enable=True profiles the steps in {GP}.steps, which is empty: nothing is profiled "
                f"(as in verl); set e.g. {GP}.steps=[2,3]"]
    return []


def _check_role(c, section: str) -> None:
    profiler = c.get(section).profiler
    contents = profiler.tool_config.torch.contents or []
    unknown = [x for x in contents if x not in TORCH_CONTENTS]
    if unknown:
        c.error(f"{section}.profiler.tool_config.torch.contents={list(contents)}: {unknown} not among {', '.join(TORCH_CONTENTS)}")
    if profiler.tool not in TOOLS:
        c.error(f"{section}.profiler.tool={profiler.tool} is not one of {', '.join(TOOLS)}")
    ranks = profiler.ranks or []
    if any(not isinstance(r, int) or r < 0 for r in ranks):
        c.error(f"{section}.profiler.ranks={list(ranks)} must list ranks of the role's worker group, from 0")
