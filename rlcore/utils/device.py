"""Hardware facts any layer may ask for: a device's nominal bf16 peak and its measured GEMM rate (the MFU
denominator), as torchtitan keeps get_peak_flops in its bottom-layer utils."""

from __future__ import annotations

import time

import torch

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets: the MFU denominator on CUDA.
# Matched by substring of torch.cuda.get_device_name(), longest name first ("H100 PCIe" before "H100").
NOMINAL_BF16_TFLOPS = {
    "B200": 2250.0, "H200": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H800": 989.4, "H20": 148.0,
    "A100": 312.0, "A800": 312.0, "L40S": 362.1, "L40": 181.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0,
    "RTX 4090": 165.2, "MI300X": 1307.4, "MI250X": 383.0,
}


def nominal_peak_flops(device_name: str) -> float | None:
    for name in sorted(NOMINAL_BF16_TFLOPS, key=len, reverse=True):
        if name.lower() in device_name.lower():
            return NOMINAL_BF16_TFLOPS[name] * 1e12
    return None


def measure_gemm_flops(device: torch.device, dtype: torch.dtype, n: int, reps: int = 5) -> float:
    """FLOP/s of an n x n x n matmul, the best of `reps` after a warm-up: the device's practical peak."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first is the warm-up
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
