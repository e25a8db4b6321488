"""Mixture-of-experts families (Qwen3-MoE, Qwen2-MoE, DeepSeek-V3) on megatron-core: the one place that maps an HF MoE block
onto megatron-core's MoELayer, in three parts read by model.py and weights.py:

1. `moe_fields`: the TransformerConfig fields an HF MoE config implies (experts, top-k, router normalisation,
   shared expert and its gate) and rlcore's RL defaults (no load-balancing loss, fp32 router, alltoall dispatch),
   (the expert-parallel sizes come from model.Layout).
2. `layer_map`: HF names of the router and the shared expert inside a layer (merged into weights.py's map).
3. Routed experts: megatron-core holds one MLP per local expert (`mlp.experts.local_experts.<i>.linear_fc{1,2}`,
   EP rank j holding experts [j*E/EP, (j+1)*E/EP), each split over the expert-TP group like a dense MLP); HF holds
   the fused 3-D `mlp.experts.gate_up_proj [E, 2*I, H]` (each expert's gate rows, then its up rows) and
   `mlp.experts.down_proj [E, H, I]`. A checkpoint on disk names one 2-D tensor per expert
   (rlcore.models.experts). Loading reads each local expert's rows from either form; the weight stream gathers a
   layer's experts once, over the expert-TP x EP group, into the fused tensors HF's modules (the native rollout)
   load.

HF's router (TopKRouter) softmaxes the logits in fp32, keeps the top-k, and renormalises them when
`norm_topk_prob`. megatron-core's equivalents: `moe_router_pre_softmax=True` is softmax-then-top-k without
renormalising (norm_topk_prob=False); `False` is top-k-then-softmax over the k logits, which is the renormalised
top-k of the full softmax (norm_topk_prob=True), equal up to rounding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from rlcore.families import is_moe, num_experts


def layer_map(shared: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """megatron-core name inside a MoE layer -> (kind, HF names inside model.layers.{i}); kinds as in weights.py.
    `shared`: the family's HF module of the shared expert(s) (rlcore.families: Megatron.shared_experts)."""
    return {
        "mlp.router.weight": ("copy", ("mlp.gate.weight",)),
        # DeepSeek-V3's router bias (a buffer on both sides: it chooses experts, nothing trains it)
        "mlp.router.expert_bias": ("copy", ("mlp.gate.e_score_correction_bias",)),
        "mlp.shared_experts.linear_fc1.weight": ("gate_up", (f"{shared}.gate_proj.weight", f"{shared}.up_proj.weight")),
        "mlp.shared_experts.linear_fc2.weight": ("split1", (f"{shared}.down_proj.weight",)),
        "mlp.shared_experts.gate_weight": ("copy", ("mlp.shared_expert_gate.weight",)),  # Qwen2-MoE
    }


def moe_columns(config) -> dict[int, int]:
    """Each MoE layer's column in the routes `[.., layers, top_k]` by its global layer index: HF's routers count only
    the layers that route (DeepSeek-V3's first layers are dense)."""
    freq, n = config.moe_layer_freq, config.num_layers
    pattern = freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(n)]
    layers = [i for i in range(n) if pattern[i]] if config.num_moe_experts else []
    return {layer: column for column, layer in enumerate(layers)}


# A local expert's weight: (local index, 1 | 2).
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight")
# The fused HF parameter each projection of the routed experts belongs to.
FUSED = {"1": "mlp.experts.gate_up_proj", "2": "mlp.experts.down_proj"}
EXPERT_KINDS = ("expert_fc1", "expert_fc2")


def moe_fields(hf_config, tp: int, sequence_parallel: bool) -> dict[str, Any]:
    """TransformerConfig fields of an HF MoE config (empty for a dense one)."""
    config = hf_config.to_dict()
    if not is_moe(config):
        return {}
    top_k, normalise = config["num_experts_per_tok"], bool(config.get("norm_topk_prob", False))
    if top_k == 1 and normalise:
        # HF's weight is then always 1.0; megatron-core refuses top-k-then-softmax at k=1 (zero router gradient).
        raise ValueError(f"{config['model_type']} with num_experts_per_tok=1 and norm_topk_prob=true has no megatron-core "
                         "router equivalent; use strategy=fsdp2 for this model")
    if tp > 1 and not sequence_parallel:
        # megatron-core's MoELayer raises in training when TP > 1 runs without sequence parallelism.
        raise ValueError(f"{config['model_type']} (MoE) with megatron.tensor_model_parallel_size={tp} needs "
                         "megatron.sequence_parallel=true (megatron-core's MoE layer refuses TP without it)")
    shared = config.get("shared_expert_intermediate_size") or None
    return dict(
        num_moe_experts=num_experts(config),
        moe_router_topk=top_k,
        moe_ffn_hidden_size=config["moe_intermediate_size"],
        moe_router_pre_softmax=not normalise,
        moe_shared_expert_intermediate_size=shared,
        moe_shared_expert_gate=shared is not None,  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x)
        # RL defaults (verl's too): the policy gradient alone moves the router; override_transformer_config may
        # turn a balancing loss back on (moe_router_load_balancing_type, moe_aux_loss_coeff).
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        # HF routes in fp32 (softmax over fp32 logits); a bf16 top-k would flip near-ties between the engines.
        moe_router_dtype="fp32",
        moe_grouped_gemm=False,  # per-expert local MLPs: no TransformerEngine / grouped_gemm kernels needed
        moe_enable_routing_replay=True,  # routes recorded / replayed on request (routes.py); free routing otherwise
        # The dispatcher stays model.py's alltoall unless override_transformer_config names allgather.
    )


# ---------------------------------------------------------------------------------------------------- weights
def expert_param(name_in_layer: str) -> tuple[int, str] | None:
    """(local expert index, "1" | "2") of a routed expert's weight inside a layer; None for any other name."""
    m = _EXPERT.fullmatch(name_in_layer)
    return (int(m.group(1)), m.group(2)) if m else None


def ep_layout() -> tuple[int, int, int, int]:
    """(EP rank, EP size, expert-TP rank, expert-TP size) of this rank."""
    from megatron.core import parallel_state as mpu

    return (mpu.get_expert_model_parallel_rank(), mpu.get_expert_model_parallel_world_size(),
            mpu.get_expert_tensor_parallel_rank(), mpu.get_expert_tensor_parallel_world_size())


@dataclass(frozen=True)
class ExpertStack:
    """A layer's local experts' fc1 (or fc2) weights of one chunk, exported together as one fused HF tensor."""

    chunk: int
    names: tuple[str, ...]   # the local experts' parameters, in local order
    kind: str                # expert_fc1 | expert_fc2
    hf_names: tuple[str, ...]  # (the fused HF name,)
    export: bool = True

    @property
    def name(self) -> str:
        return self.names[0].rsplit(".local_experts.", 1)[0] + f".linear_fc{self.kind[-1]}"


def stack_experts(entries: list) -> list:
    """The export list: each layer's local-expert entries replaced, where the first of them stood, by one
    ExpertStack per projection (the rest of the entries unchanged)."""
    out, stacks = [], {}
    for e in entries:
        if e.kind not in EXPERT_KINDS:
            out.append(e)
            continue
        key = (e.chunk, e.hf_names)
        if key not in stacks:
            stacks[key] = []
            out.append(key)
        stacks[key].append(e)
    return [ExpertStack(x[0], tuple(m.name for m in sorted(stacks[x], key=lambda m: m.expert)), stacks[x][0].kind, x[1])
            if isinstance(x, tuple) else x for x in out]


def local_stack(chunk: torch.nn.Module, stack: ExpertStack) -> torch.Tensor:
    """`[local experts, rows, cols]`: this rank's pieces of the stack's experts."""
    return torch.stack([chunk.get_parameter(n).detach() for n in stack.names])


def fused_experts(kind: str, shards: list[torch.Tensor], ep: int, etp: int) -> torch.Tensor:
    """The fused HF tensor from every expert-TP x EP rank's stack, `shards[ep_rank * etp + etp_rank]`:
    gate_up_proj `[E, 2*I, H]` (each expert's gate rows, then its up rows) or down_proj `[E, H, I]`."""
    per_ep = [shards[j * etp : (j + 1) * etp] for j in range(ep)]
    if kind == "expert_fc2":  # split on the input (intermediate) dimension over expert-TP
        return torch.cat([torch.cat(pieces, dim=2) for pieces in per_ep])
    halves = [[p.chunk(2, dim=1) for p in pieces] for pieces in per_ep]  # each piece: [gate rows; up rows]
    return torch.cat([torch.cat([h[0] for h in hs] + [h[1] for h in hs], dim=1) for hs in halves])


def read_expert(ckpt, fused_name: str, expert: int, kind: str, shape: torch.Size, etp_rank: int) -> torch.Tensor:
    """This expert-TP rank's piece `shape` of global expert `expert`, from per-expert checkpoint names or, when the
    checkpoint holds them, HF's fused 3-D tensors."""
    from rlcore.models.experts import expert_pieces

    if kind == "expert_fc2":  # down_proj [H, I]: columns of this rank
        n = shape[1]
        per_expert = expert_pieces(fused_name, expert, shape[0])[0][0]
        cols = (etp_rank * n, (etp_rank + 1) * n)
        return ckpt.slice(per_expert, cols=cols) if per_expert in ckpt else ckpt.slice(fused_name, cols=cols, expert=expert)
    n = shape[0] // 2  # gate_up: this rank's gate rows, then its up rows
    pieces = expert_pieces(fused_name, expert, 2)  # [(gate name, 0, 1), (up name, 1, 1)]
    if pieces[0][0] in ckpt:
        return torch.cat([ckpt.slice(name, rows=(etp_rank * n, (etp_rank + 1) * n)) for name, _, _ in pieces])
    intermediate = ckpt.shape(fused_name)[1] // 2
    return torch.cat([ckpt.slice(fused_name, rows=(half * intermediate + etp_rank * n, half * intermediate + (etp_rank + 1) * n),
                                 expert=expert) for half in (0, 1)])
