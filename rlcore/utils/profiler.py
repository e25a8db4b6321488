"""A worker's profiler: torch.profiler traces or the CUDA allocator's history, around what the controller asks.

The controller starts it on the profiled steps (`Worker.start_profile`) and stops it after them; in between, each
worker call runs under it (`Worker.timed_call`). With `discrete`, each call gets its own trace instead of one per
step. Traces are Chrome trace JSON named `*.pt.trace.json`: Perfetto (ui.perfetto.dev) and TensorBoard's profiler
plugin both read them. torch_memory writes the allocator's snapshot (`*.pickle`, for pytorch.org/memory_viz).
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch


@dataclass
class ProfileSpec:
    """What one worker group profiles on a step, the same for every rank (each rank looks itself up in `ranks`)."""

    tool: str  # torch | torch_memory | nsys (the process runs under Nsight; here only its capture range)
    save_dir: str  # this step's (or run of steps') folder
    group: str  # the worker group's name, in the file names
    ranks: Optional[list[int]] = None  # None = every rank
    discrete: bool = False  # torch: one trace per call; nsys: one capture range per call
    contents: list[str] = field(default_factory=list)  # torch: cpu, cuda, memory, shapes, stack
    max_entries: int = 100000  # torch_memory
    stacks: str = "all"  # torch_memory: python | all
    context: str = "all"  # torch_memory: all | alloc | state
    memory_kwargs: dict = field(default_factory=dict)  # torch_memory: more arguments of _record_memory_history

    def profiles(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


class WorkerProfiler:
    """One worker process's profiler: idle until start(), then around each call until stop()."""

    def __init__(self, rank: int, device_type: str):
        self.rank, self.device_type = rank, device_type
        self.spec: Optional[ProfileSpec] = None
        self._trace = None  # the open torch.profiler.profile of a whole step
        self.written: list[str] = []

    def start(self, spec: ProfileSpec) -> None:
        if not spec.profiles(self.rank):
            return
        self.spec = spec
        os.makedirs(spec.save_dir, exist_ok=True)
        if spec.tool == "torch" and not spec.discrete:
            self._trace = self._torch_profile()
            self._trace.__enter__()
        elif spec.tool == "torch_memory":
            torch.cuda.memory._record_memory_history(max_entries=spec.max_entries, stacks=spec.stacks, context=spec.context,
                                                     **spec.memory_kwargs)
        elif spec.tool == "nsys" and not spec.discrete:  # the process runs under Nsight with capture-range=cudaProfilerApi
            torch.cuda.profiler.start()

    def stop(self) -> list[str]:
        """Ends the step's profile; the files this rank wrote since start()."""
        spec, self.spec = self.spec, None
        if spec is None:
            return []
        if self._trace is not None:
            trace, self._trace = self._trace, None
            trace.__exit__(None, None, None)
            self._export(trace, self._path(spec, None))
        elif spec.tool == "nsys" and not spec.discrete:  # Nsight writes its report when the process exits (Ray's logs)
            torch.cuda.profiler.stop()
        elif spec.tool == "torch_memory":
            path = self._path(spec, None, ".pickle")
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written.append(path)
        written, self.written = self.written, []
        return written

    @contextmanager
    def call(self, method: str) -> Iterator[None]:
        """One worker call: a trace of its own in discrete mode, a labelled range inside the step's trace otherwise."""
        spec = self.spec
        if spec is not None and spec.tool == "nsys" and spec.discrete:
            torch.cuda.profiler.start()
            try:
                yield
            finally:
                torch.cuda.profiler.stop()
            return
        if spec is None or spec.tool != "torch":
            yield
            return
        trace = self._torch_profile() if spec.discrete else nullcontext()
        with trace, torch.profiler.record_function(method):
            yield
        if spec.discrete:
            self._export(trace, self._path(spec, method))

    def _torch_profile(self):
        contents = set(self.spec.contents) or {"cpu", "cuda"}
        activities = [torch.profiler.ProfilerActivity.CPU] if "cpu" in contents else []
        if "cuda" in contents and self.device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(activities=activities or [torch.profiler.ProfilerActivity.CPU],
                                      record_shapes="shapes" in contents, profile_memory="memory" in contents,
                                      with_stack="stack" in contents)

    def _export(self, trace, path: str) -> None:
        trace.export_chrome_trace(path)
        self.written.append(path)

    def _path(self, spec: ProfileSpec, method: Optional[str], suffix: str = ".pt.trace.json") -> str:
        name = f"{spec.group}_rank{self.rank}" + (f"_{method}" if method else "")
        path, n = os.path.join(spec.save_dir, name + suffix), 1
        while os.path.exists(path):  # a method called twice in a step (discrete): one file per call
            n += 1
            path = os.path.join(spec.save_dir, f"{name}_{n}{suffix}")
        return path
