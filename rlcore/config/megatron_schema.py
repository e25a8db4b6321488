"""Megatron-core layout and offloads of a role trained with strategy=megatron (`<role>.megatron.*`, verl's
engine/megatron.yaml): the fields, then the rules for what rlcore's megatron engine does not do.

This module imports neither torch nor ray.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from rlcore.config.moe_schema import EngineRouterReplayConfig
from rlcore.config.suggest import _nearest, _suggest, _use


@dataclass
class MegatronConfig:
    """Megatron-core TP/PP layout and offloads (`<role>.megatron.*`, verl's engine/megatron.yaml), used with
    strategy=megatron (rlcore/engine/megatron). Context and expert parallelism and dist-checkpoint loading are
    refused before Ray starts."""

    param_offload: bool = False  # parameters on CPU between uses
    grad_offload: bool = False  # gradients on CPU between uses
    optimizer_offload: bool = False  # optimizer state on CPU between steps
    tensor_model_parallel_size: int = 1  # TP: each layer's matrices split over this many devices
    expert_model_parallel_size: int = 1  # EP: MoE experts split over this many devices
    expert_tensor_parallel_size: Optional[int] = None  # TP inside each expert; None = tensor_model_parallel_size
    pipeline_model_parallel_size: int = 1  # PP: layers split into this many stages
    virtual_pipeline_model_parallel_size: Optional[int] = None  # interleaved stages per device
    context_parallel_size: int = 1  # CP: each sequence split over this many devices
    sequence_parallel: bool = True  # shard norms/dropout activations over the TP group
    use_distributed_optimizer: bool = True  # shard optimizer state over data-parallel ranks (ZeRO-1)
    use_dist_checkpointing: bool = False  # load from a megatron dist checkpoint instead of HF weights (refused)
    dist_checkpointing_path: Optional[str] = None  # that checkpoint
    seed: int = 42  # megatron RNG seed
    override_ddp_config: Dict[str, Any] = field(default_factory=dict)  # megatron DDP config fields
    override_transformer_config: Dict[str, Any] = field(default_factory=lambda: {  # TransformerConfig fields
        "recompute_granularity": None, "recompute_modules": ["core_attn"], "recompute_method": None,
        "recompute_num_layers": None, "attention_backend": "flash"})
    override_mcore_model_config: Dict[str, Any] = field(default_factory=dict)  # mcore GPTModel fields (refused: rlcore derives them from HF)
    use_mbridge: bool = False  # verl: convert HF <-> megatron with mbridge; rlcore always uses its own converter
    vanilla_mbridge: bool = True  # verl: mbridge's built-in model bridges (no effect in rlcore, as use_mbridge)
    use_remove_padding: bool = True  # packed sequences (THD layout); packs only if model.use_remove_padding too
    dtype: str = "bfloat16"  # compute dtype
    use_megatron_fsdp: bool = False  # verl 0.9: Megatron-FSDP instead of megatron's DDP (refused)
    # verl 0.9's engine-side copy of <role>.router_replay (moved onto it as the config composes)
    router_replay: EngineRouterReplayConfig = field(default_factory=EngineRouterReplayConfig)


# ---------------------------------------------------------------------------------------------------- rules
# Rules for `<role>.megatron.*` (strategy=megatron): what rlcore's megatron engine does not do, refused before Ray
# starts and naming the key. `c` is validate's checker (get / error). The engine re-checks MEGATRON_UNSUPPORTED and
# moe_override_problems for callers that build it directly.
#
# Expert parallelism is a layout rule here (megatron-core's: TP x PP x CP divides the world, and so does expert-TP x
# EP x PP); whether the model has experts to split is known only from its config.json, which the engine checks
# (rlcore.engine.megatron.model: a dense model with expert_model_parallel_size > 1 is refused with the reason).


# <role>.megatron.<key>: (the value rlcore supports, what any other value would ask for)
MEGATRON_UNSUPPORTED = {
    # megatron-core's context parallelism runs only inside TransformerEngine's attention (its local
    # DotProductAttention asserts context_parallel_size == 1), and rlcore builds the local spec (no TE on CPU, none
    # required on CUDA).
    "context_parallel_size": (1, "context parallelism: megatron-core runs it only in TransformerEngine's attention, and rlcore "
                                 "builds megatron's local layer spec; for long sequences use strategy=fsdp2 with "
                                 "ulysses_sequence_parallel_size (Ulysses)"),
    "use_dist_checkpointing": (False, "initial weights from a Megatron dist checkpoint; rlcore reads the HF checkpoint at model.path"),
    "use_megatron_fsdp": (False, "Megatron-FSDP (parameters sharded by megatron-core's own FSDP): rlcore's megatron engine "
                                 "shards optimizer state with use_distributed_optimizer; for fully sharded parameters use "
                                 "strategy=fsdp2"),
}


# override_transformer_config.<key>: (values rlcore refuses, why and what to use instead)
MOE_REFUSED_OVERRIDES = {
    "moe_token_dispatcher_type": ({"flex"}, "the flex dispatcher runs DeepEP / HybridEP, which need CUDA and their own kernels "
                                            "(not part of rlcore's install); use moe_token_dispatcher_type=alltoall"),
    "moe_enable_deepep": ({True}, "DeepEP needs CUDA and its kernels (not part of rlcore's install); use "
                                  "moe_token_dispatcher_type=alltoall and moe_enable_deepep=false"),
    "moe_grouped_gemm": ({True}, "grouped GEMM runs TransformerEngine's or the grouped_gemm package's CUDA kernels, and rlcore "
                                 "converts megatron-core's per-expert local MLPs; use moe_grouped_gemm=false"),
}
MOE_DISPATCHERS = ("alltoall", "allgather")


def moe_override_problems(overrides: dict, pipeline_parallel: int, expert_parallel: int) -> List[str]:
    """What rlcore refuses among override_transformer_config's moe_* keys (shared by the validator and the engine)."""
    problems = []
    for key, (refused, why) in MOE_REFUSED_OVERRIDES.items():
        if overrides.get(key) in refused:
            problems.append(f"override_transformer_config.{key}={overrides[key]}: {why}")
    dispatcher = overrides.get("moe_token_dispatcher_type")
    if dispatcher is not None and dispatcher not in MOE_DISPATCHERS and dispatcher != "flex":
        problems.append(f"override_transformer_config.moe_token_dispatcher_type={dispatcher} is not one of {', '.join(MOE_DISPATCHERS)}")
    # rlcore trims each micro-batch to its own longest row, so ranks that hold different data hold different token
    # counts; the allgather dispatcher gathers one equal-sized block per expert-TP x EP rank (measured on gloo: a
    # size mismatch abort at EP2), and megatron-core refuses it with variable_seq_lengths (pipeline stages).
    if dispatcher == "allgather" and (pipeline_parallel > 1 or expert_parallel > 1):
        problems.append(f"override_transformer_config.moe_token_dispatcher_type=allgather cannot run with pipeline_model_parallel_size="
                        f"{pipeline_parallel} and expert_model_parallel_size={expert_parallel}: it gathers equal-sized token blocks from "
                        "every expert-parallel rank, while rlcore's micro-batches have widths of their own on each data-parallel rank "
                        "(and megatron-core refuses it with pipeline stages); use moe_token_dispatcher_type=alltoall")
    return problems


def check_megatron(c, section: str) -> None:
    """What rlcore's megatron engine does not do, refused before Ray starts, naming the key."""
    m = c.get(section)
    for key, (ok, what) in MEGATRON_UNSUPPORTED.items():
        if getattr(m, key) != ok:
            c.error(f"{section}.{key}={getattr(m, key)} ({what}) is not supported by rlcore; use {section}.{key}={ok}")
    overrides = m.override_transformer_config or {}
    for problem in moe_override_problems(overrides, m.pipeline_model_parallel_size, m.expert_model_parallel_size):
        c.error(f"{section}.{problem}")
    if m.override_mcore_model_config:
        c.error(f"{section}.override_mcore_model_config is not supported by rlcore: its megatron engine derives the GPTModel "
                "from the HF config.json; change the model with actor_rollout_ref.model.override_config (HF keys) and "
                f"the layers with {section}.override_transformer_config")
    pp, vpp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1 and pp < 2:
        c.error(f"{section}.virtual_pipeline_model_parallel_size={vpp} interleaves pipeline stages and needs "
                f"pipeline_model_parallel_size >= 2 (it is {pp}); use {section}.virtual_pipeline_model_parallel_size=null")


def check_same_layout(c, ref: str, actor: str) -> None:
    """The reference shares the actor's processes, and megatron-core one layout per process."""
    a, r = c.get(actor), c.get(ref)
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                "expert_model_parallel_size", "expert_tensor_parallel_size"):
        if getattr(r, key) != getattr(a, key):
            c.error(f"{ref}.{key}={getattr(r, key)} differs from {actor}.{key}={getattr(a, key)}: the reference "
                    f"runs in the actor's processes, which hold one megatron layout; use {ref}.{key}={getattr(a, key)}")


def _megatron_model_parallel(c, section: str, world: int, per_node: int) -> Optional[int]:
    """Megatron's layout: world = TP x PP x CP x DP. Returns TP x PP x CP (devices per model replica)."""
    keys = [f"{section}.{name}_parallel_size" for name in ("tensor_model", "pipeline_model", "context")]
    if not all([c.at_least(key, 1) for key in keys]):
        return None
    tp, pp, cp = (c.get(key) for key in keys)
    if world % (tp * pp * cp):
        fixes = _suggest(pp, [lambda v: world % (tp * v * cp) == 0 and c.batch_splits(world // (tp * v * cp)),
                              lambda v: world % (tp * v * cp) == 0], 1, world)
        c.error(f"{keys[0]}={tp} x {keys[1]}={pp} x {keys[2]}={cp} = {tp * pp * cp} devices per model replica does not "
                f"divide the world size {world} (trainer.nnodes x trainer.n_gpus_per_node; world = TP x PP x CP x DP); "
                + (_use(keys[1], fixes)
                   or _use(keys[0], _suggest(tp, [lambda v: world % (v * pp * cp) == 0 and c.megatron_tp_splits_heads(v)
                                                  and c.batch_splits(world // (v * pp * cp))], 1, world))
                   or _both(c, keys, tp, world // cp)))
        return None
    if per_node % tp:
        c.error(f"{keys[0]}={tp} must divide the ranks per node ({per_node}): a TP group is contiguous ranks, and ranks are "
                "placed node by node, so it would straddle two nodes (TP's collectives run every layer); "
                + _use(keys[0], _suggest(tp, [lambda v: per_node % v == 0 and c.megatron_tp_splits_heads(v),
                                              lambda v: per_node % v == 0], 1, per_node)))
        return None
    _check_expert_layout(c, section, world, tp, pp)  # the experts' grid does not change the data-parallel size
    return tp * pp * cp


def _check_expert_layout(c, section: str, world: int, tp: int, pp: int) -> None:
    """megatron-core's expert grid: expert-TP x EP x PP divides the world (with expert-TP = TP: EP divides the
    data-parallel size), the routed experts' gradients then averaged over the remaining expert-data-parallel ranks."""
    ep_key, etp_key = f"{section}.expert_model_parallel_size", f"{section}.expert_tensor_parallel_size"
    if not c.at_least(ep_key, 1) or (c.get(etp_key) is not None and not c.at_least(etp_key, 1)):
        return
    ep, etp = c.get(ep_key), c.get(etp_key) or tp
    if world % (etp * ep * pp) == 0:
        return
    room = world // pp
    fixes = _nearest(ep, lambda v: room % (etp * v) == 0, 1, room)
    c.error(f"{ep_key}={ep} x {etp_key}={etp if c.get(etp_key) else f'null (= tensor_model_parallel_size {tp})'} x "
            f"pipeline_model_parallel_size={pp} = {etp * ep * pp} does not divide the world size {world}: megatron-core lays the "
            f"routed experts over expert-TP x EP ranks within each pipeline stage (with expert-TP = TP, EP must divide the "
            f"data-parallel size {world // (tp * pp)}); " + _use(ep_key, fixes))


def _both(c, keys: List[str], tp: int, room: int) -> str:
    """TP and PP together, when no change of one alone divides the world: the largest TP (up to the current one)
    that splits the heads, with the largest PP that then fits."""
    for v in range(min(tp, room), 0, -1):
        if room % v == 0 and c.megatron_tp_splits_heads(v):
            pps = [p for p in range(1, room // v + 1) if (room // v) % p == 0 and p <= c.get(keys[1]) and c.batch_splits(room // (v * p))]
            if pps:
                return f"use {keys[0]}={v} {keys[1]}={max(pps)}"
    return ""
