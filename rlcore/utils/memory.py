"""Peak memory of this process on its device, reported as verl's perf/max_memory_allocated_gb."""

from __future__ import annotations

import resource
import sys

import torch

_RUN_PEAK_BYTES: dict[str, int] = {}  # CUDA: the largest per-phase peak before the current phase's window


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: the allocator's peak (torch.cuda.max_memory_allocated) over the whole run, across the per-phase windows
    reset_phase_peak opens. CPU: the process's peak resident set (what rlcore-plan's per-device estimate, runtime
    included, is compared with)."""
    if device.type == "cuda":
        return max(_RUN_PEAK_BYTES.get(str(device), 0), torch.cuda.max_memory_allocated(device)) / 2 ** 30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2 ** 30 if sys.platform == "darwin" else 2 ** 20)


def reset_phase_peak(device: torch.device) -> None:
    """Opens a new peak-memory window on CUDA (a phase's own peak), keeping the run's peak for peak_memory_gib. CPU
    has no allocator counter to reset."""
    if device.type == "cuda":
        key = str(device)
        _RUN_PEAK_BYTES[key] = max(_RUN_PEAK_BYTES.get(key, 0), torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
