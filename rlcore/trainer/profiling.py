"""The controller's side of profiling (verl's `global_profiler.*` and `<role>.profiler.*`): which worker group
profiles which ranks, started before a profiled step and stopped after it (rlcore/utils/profiler.py does the work
in the workers).

The actor, the reference and the rollout run in one process (the hybrid engine), so that group profiles the ranks
any of the three asks for; with split pools the rollout's own group answers for the rollout. Files go to
`global_profiler.save_path/step_N/` (`steps_N-M/` for consecutive steps with profile_continuous_steps).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional

from omegaconf import DictConfig

from rlcore.config.typed import dotted, plain
from rlcore.utils.profiler import ProfileSpec

ROLES = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref", "rollout": "actor_rollout_ref.rollout",
         "critic": "critic", "reward_model": "reward_model"}
HOSTS = {"actor": "actor_rollout", "ref": "actor_rollout", "rollout": "actor_rollout", "critic": "critic",
         "reward_model": "reward_model"}


def profiled_roles(cfg: DictConfig) -> dict[str, DictConfig]:
    """The roles whose profiler is enabled, by role, when a tool is set."""
    if not cfg.global_profiler.tool:
        return {}
    sections = {role: dotted(cfg)(f"{key}.profiler") for role, key in ROLES.items()}
    return {role: section for role, section in sections.items() if section.enable}


def group_specs(cfg: DictConfig, groups: dict, folder: str) -> dict[str, ProfileSpec]:
    """One spec per worker group that hosts a profiled role: its ranks (None = all), tool, options, and where its
    files go (`folder`, e.g. step_2, under the role's save_path)."""
    specs: dict[str, ProfileSpec] = {}
    memory = cfg.global_profiler.global_tool_config.torch_memory
    for role, section in profiled_roles(cfg).items():
        host = "rollout" if role == "rollout" and "rollout" in groups else HOSTS[role]
        if host not in groups:
            continue  # a role this run does not build (no critic, no reward model)
        ranks = None if section.all_ranks else (list(section.ranks) or [0])
        options = section.tool_config
        spec = specs.get(host)
        if spec is None:
            discrete = options.nsys.discrete if section.tool == "nsys" else options.torch.discrete
            save_dir = os.path.abspath(os.path.join(section.save_path or cfg.global_profiler.save_path, folder))
            specs[host] = ProfileSpec(tool=section.tool, save_dir=save_dir, group=host, ranks=ranks, discrete=bool(discrete),
                                      contents=list(options.torch.contents),
                                      max_entries=options.torch_memory.trace_alloc_max_entries, stacks=memory.stacks,
                                      context=memory.context, memory_kwargs=dict(memory.kw_args))
        elif spec.ranks is not None:
            spec.ranks = None if ranks is None else sorted(set(spec.ranks) | set(ranks))
    return specs


def nsight_runtime_env(config, group: str) -> Optional[dict]:
    """Ray's runtime_env "nsight" options for a worker group that hosts a role profiled with tool=nsys, else None:
    its processes start under Nsight Systems (global_profiler.global_tool_config.nsys.worker_nsight_options) and
    capture between the cudaProfilerStart/Stop the workers call around the profiled steps. `config`: the run's
    typed config (the SFT and reward-model trainers' have no global_profiler)."""
    g = getattr(config, "global_profiler", None)
    if g is None or g.tool != "nsys":
        return None
    get = dotted(config)
    hosted = [role for role, host in HOSTS.items() if host == group or (role == "rollout" and group == "rollout")]
    if not any(get(f"{ROLES[role]}.profiler.enable") for role in hosted):
        return None
    options = plain(g.global_tool_config.nsys.worker_nsight_options)
    # nsys's command-line spelling: true/false, not Python's True/False
    return {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in options.items()
            if value is not None}


class Profiling:
    """Around each training step: starts the groups' profilers on the first of a run of profiled steps and stops
    them after its last (every listed step is a run of one unless profile_continuous_steps)."""

    def __init__(self, cfg: DictConfig, groups: dict):
        g = cfg.global_profiler
        self.cfg, self.groups = cfg, groups
        self.steps = set(g.steps or []) if g.tool and profiled_roles(cfg) else set()
        self.continuous = bool(g.profile_continuous_steps)
        self.active: dict[str, ProfileSpec] = {}

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step in self.steps and not (self.continuous and step - 1 in self.steps):
            self._start(step, self._last_of_run(step))
        yield
        if self.active and not (self.continuous and step + 1 in self.steps):
            self._stop()

    def _last_of_run(self, step: int) -> int:
        last = step
        while self.continuous and last + 1 in self.steps:
            last += 1
        return last

    def _start(self, first: int, last: int) -> None:
        folder = f"step_{first}" if first == last else f"steps_{first}-{last}"
        self.active = group_specs(self.cfg, self.groups, folder)
        for host, spec in self.active.items():
            self.groups[host].start_profile(spec)

    def _stop(self) -> list[str]:
        written = [path for host in self.active for paths in self.groups[host].stop_profile() for path in paths]
        folders = sorted({spec.save_dir for spec in self.active.values()})
        self.active = {}
        print(f"rlcore: profile: {len(written)} file(s) in {', '.join(folders)}", flush=True)
        return written
