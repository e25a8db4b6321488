"""Peak memory of this process on its device, reported as verl's perf/max_memory_allocated_gb."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: the allocator's peak (torch.cuda.max_memory_allocated). CPU: the process's peak resident set
    (what rlcore-plan's per-device estimate, runtime included, is compared with)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2 ** 30 if sys.platform == "darwin" else 2 ** 20)
