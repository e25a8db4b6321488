"""A CPU run warns when a role asks for bf16 that the CPU only emulates, naming each key and the fix."""

import pytest
import torch

from rlcore.config import compose
from rlcore.train import cpu_dtype_warnings
from rlcore.utils import cpu


@pytest.mark.parametrize("flags, capability, native", [
    ("fpu avx2 avx512f avx512_bf16", "AVX512", True),
    ("fpu amx_bf16 amx_tile avx512f", "AVX512", True),
    ("fpu avx2 avx512f avx512_bf16", "AVX2", False),  # ATEN_CPU_CAPABILITY=avx2: torch runs its AVX2 kernels
    ("fpu avx2 fma", "AVX2", False),  # an AVX2-only EPYC
])
def test_native_bf16_needs_the_flag_and_torch_avx512_kernels(tmp_path, monkeypatch, flags, capability, native):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor : 0\nflags : {flags}\n")
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert cpu.native_bf16_matmul(str(info)) is native


def test_bf16_roles_on_an_emulating_cpu_are_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: False)
    assert cpu_dtype_warnings(compose(["recipe=tiny_cpu"])) == []  # the CPU recipes stay float32
    warnings = cpu_dtype_warnings(compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
                                           "actor_rollout_ref.rollout.dtype=bfloat16"]))
    assert len(warnings) == 1
    assert "actor_rollout_ref.rollout.dtype=bfloat16, actor_rollout_ref.actor.fsdp_config.dtype=bfloat16 on a CPU" in warnings[0]
    assert warnings[0].endswith("Use actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.actor.fsdp_config.dtype=float32 "
                                "(as the tiny_cpu recipes do)")
    megatron = cpu_dtype_warnings(compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.megatron.dtype=bfloat16"],
                                          config_name="ppo_megatron_trainer"))
    assert "actor_rollout_ref.actor.megatron.dtype=bfloat16" in megatron[0]
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: True)
    assert cpu_dtype_warnings(compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16"])) == []
