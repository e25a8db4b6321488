"""What this CPU computes fast: used to warn before a CPU run picks a dtype the hardware only emulates."""

from __future__ import annotations

import platform

import torch
from omegaconf import OmegaConf

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_matmul(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """Whether torch multiplies bf16 matrices in hardware here (x86: AVX-512 BF16 or AMX, with torch's AVX-512
    kernels selected). Without them bf16 matmul is emulated: measured orders of magnitude slower than fp32 on an
    AVX2-only EPYC. Unknown platforms answer True (no warning rather than a wrong one)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    try:
        with open(cpuinfo_path) as f:
            flags = f.read()
    except OSError:
        return True
    return any(flag in flags for flag in _BF16_FLAGS) and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def half_precision_keys(cfg, uses_ref: bool, uses_critic: bool) -> list[str]:
    """The dtype keys of the active roles that ask for bf16 compute (`key=value`)."""
    arr = "actor_rollout_ref"
    roles = [(f"{arr}.actor", cfg.actor_rollout_ref.actor.strategy)]
    if uses_ref:
        roles.append((f"{arr}.ref", cfg.actor_rollout_ref.ref.strategy))
    keys = [f"{arr}.rollout.dtype"]
    for section, strategy in roles:
        keys.append(f"{section}.megatron.dtype" if strategy == "megatron" else f"{section}.fsdp_config.dtype")
    if uses_critic:
        keys.append("critic.megatron.dtype" if cfg.critic.strategy == "megatron" else "critic.fsdp.dtype")
    values = {key: OmegaConf.select(cfg, key) for key in keys}
    return [f"{key}={value}" for key, value in values.items() if str(value) in ("bfloat16", "bf16")]
