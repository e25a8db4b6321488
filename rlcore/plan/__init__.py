"""rlcore-plan: batch arithmetic and a per-device memory estimate for a composed config (no torch, no ray)."""

from rlcore.plan.arch import BUILTIN, Arch, builtin_arch, resolve_arch
from rlcore.plan.memory import MemoryPlan, RoleMemory, format_memory, memory_plan, supervised_memory_plan

__all__ = ["BUILTIN", "Arch", "MemoryPlan", "RoleMemory", "builtin_arch", "format_memory", "memory_plan", "resolve_arch", "supervised_memory_plan"]
