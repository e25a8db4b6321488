"""Process-wide switches for bit-for-bit repeatable runs on one kind of hardware (verl's enable_full_determinism,
without its reseeding: rlcore's seeds are set where each RNG is made)."""

from __future__ import annotations

import os

import torch


def deterministic_kernels() -> None:
    """torch picks deterministic kernels (warning where an op has none; flash-attn's backward follows it:
    rlcore.models.varlen), cuBLAS a fixed workspace (which kernel it picks, and so its reduction order, otherwise
    follows the workspace a stream gets; read at the process's first cuBLAS call, so call this before any kernel
    runs) and cuDNN no benchmarked algorithm choice."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
