"""A Megatron role's model-parallel layout, derived once from its `megatron` section: what the engine initialises
megatron-core's groups with (rlcore.engine.megatron) and what the memory plan divides by (rlcore.plan.memory).

This module imports neither torch nor megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The model-parallel layout of one engine (`<role>.megatron.*`)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    sp: bool = False  # sequence parallelism (only with tp > 1): norms and residuals on 1/tp of the sequence
    ep: int = 1   # expert parallelism: a MoE layer's routed experts split over this many ranks
    etp: int = 1  # TP inside each routed expert (megatron's expert_tensor_parallel_size; null = tp)
    cp: int = 1   # context parallelism (refused by the validator; counted where the ranks are divided)

    @classmethod
    def from_config(cls, m) -> "Layout":
        """`m`: the role's megatron section (rlcore.config.schema.MegatronConfig, or its DictConfig), every key read
        as given: the defaults are the schema's."""
        vpp, tp = m.virtual_pipeline_model_parallel_size, m.tensor_model_parallel_size
        return cls(tp=tp, pp=m.pipeline_model_parallel_size, vpp=vpp if vpp and vpp > 1 else None, sp=tp > 1 and bool(m.sequence_parallel),
                   ep=m.expert_model_parallel_size, etp=m.expert_tensor_parallel_size or tp, cp=m.context_parallel_size)

    def dp(self, world: int) -> int:
        """Data-parallel replicas of the dense part among `world` ranks."""
        return max(1, world // (self.tp * self.pp * self.cp))

    def expert_dp(self, world: int) -> int:
        """Data-parallel replicas of each routed expert among `world` ranks."""
        return max(1, world // (self.etp * self.ep * self.pp))
