"""Router replay on megatron-core: record each MoE layer's routes in a forward, or force given routes in a forward,
through megatron-core 0.16's RouterReplay (TransformerConfig.moe_enable_routing_replay, one instance per router).

Routes travel as the batch field `routed_experts` `[batch, seq, layers, top_k]` int16 aligned with `input_ids`
(rlcore.models.router, the FSDP2 engine's format). megatron-core routes the tokens in its own order: the sequence
dimension first (`[s, b]` flattened, s-major), rows left-aligned (rlcore.engine.megatron.inputs), or the packed
(THD) valid tokens; under sequence parallelism each TP rank routes its contiguous 1/tp of those tokens. A replayed
route keeps the router's gradient: megatron-core gathers the live scores at the forced indices (and, for
top-k-then-softmax routers, normalises over them), as HF's hook in rlcore.models.router does.

Scope: pipeline parallelism (routes of other stages' layers) and activation recomputation (megatron-core replays a
recomputed layer from a per-router queue, which one forward per micro-batch would have to fill in schedule order)
are refused with the reason.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state as mpu
from megatron.core.transformer.moe.router_replay import RouterReplayAction
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

from rlcore.engine.megatron.inputs import ModelInputs
from rlcore.models.router import ROUTE_DTYPE, ROUTES

MODES = ("free", "record", "replay")


def layer_routers(chunks) -> list:
    """Each MoE layer's router of this rank's chunks, in layer order; [] for a dense model."""
    return [layer.mlp.router for chunk in chunks for layer in chunk.decoder.layers if hasattr(layer.mlp, "router")]


def check_mode(mode: str, routers: list, config) -> None:
    if mode not in MODES:
        raise ValueError(f"routes={mode!r} is not one of {', '.join(MODES)}")
    if mode == "free":
        return
    if not routers:
        raise ValueError(f"router replay ({mode}) on a model without MoE routers: set actor_rollout_ref.actor.router_replay.mode=disabled")
    if config.pipeline_model_parallel_size > 1:
        raise ValueError(f"router replay ({mode}) with megatron.pipeline_model_parallel_size={config.pipeline_model_parallel_size} is not "
                         "supported yet by rlcore (each stage routes its own layers); use pipeline_model_parallel_size=1")
    if config.recompute_granularity is not None:
        raise ValueError(f"router replay ({mode}) with activation recomputation (recompute_granularity={config.recompute_granularity}) "
                         "is not supported yet by rlcore's megatron engine; turn model.enable_gradient_checkpointing off")


def _model_order(routes: torch.Tensor, mb_mask: torch.Tensor, inputs: ModelInputs) -> torch.Tensor:
    """`[batch, seq, layers, top_k]` -> `[tokens, layers, top_k]` in the order megatron-core routes them (all TP
    ranks' tokens). Padding tokens get experts 0..k-1: a recorded batch may hold zeros there, and a token routed
    twice to one expert counts once, so TP ranks would exchange uneven token counts (gloo's all-gather refuses)."""
    distinct = torch.arange(routes.shape[-1], dtype=routes.dtype, device=routes.device)
    if inputs.response_valid is not None:  # packed: the valid tokens row by row, then a padding sequence (SP)
        valid = routes[mb_mask]
        pad = inputs.input_ids.shape[1] - len(valid)
        return torch.cat([valid, distinct.expand(pad, *valid.shape[1:])]) if pad else valid
    order = inputs.token_order  # [b, width]: the original column of each left-aligned column
    width = order.shape[1]
    if width > routes.shape[1]:  # SP padded the rows beyond the batch's width
        routes = torch.nn.functional.pad(routes, (0, 0, 0, 0, 0, width - routes.shape[1]))
        mb_mask = torch.nn.functional.pad(mb_mask, (0, width - mb_mask.shape[1]))
    aligned = routes.gather(1, order[:, :, None, None].expand(-1, -1, *routes.shape[2:]))  # [b, width, L, k]
    real = mb_mask.gather(1, order)[:, :, None, None]
    return torch.where(real, aligned, distinct).transpose(0, 1).reshape(-1, *routes.shape[2:])


def _batch_order(tokens: torch.Tensor, mb_mask: torch.Tensor, inputs: ModelInputs, seq: int) -> torch.Tensor:
    """The inverse of _model_order: `[tokens, layers, top_k]` -> `[batch, seq, layers, top_k]` (zero where a
    column was never routed: packed padding)."""
    out = tokens.new_zeros(mb_mask.shape[0], seq, *tokens.shape[1:])
    if inputs.response_valid is not None:
        out[mb_mask] = tokens[: int(mb_mask.sum())]
        return out
    order = inputs.token_order
    b, width = order.shape
    aligned = tokens.view(width, b, *tokens.shape[1:]).transpose(0, 1)  # [b, width, L, k]
    keep = order < seq  # SP's extra padding columns have no place in the batch
    rows = torch.arange(b, device=order.device)[:, None].expand_as(order)
    out[rows[keep], order[keep]] = aligned[keep]
    return out


class RouteReplay:
    """Sets this rank's routers for one forward (call `before` right before the model runs) and reads what they
    recorded (`recorded`, in the loss function of the same micro-batch)."""

    def __init__(self, chunks, config) -> None:
        self.routers = layer_routers(chunks)
        self.config = config
        self.sp = config.sequence_parallel and config.tensor_model_parallel_size > 1

    def before(self, mode: str, mb, inputs: ModelInputs) -> None:
        check_mode(mode, self.routers, self.config)
        for router in self.routers:
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(None if mode == "free" else RouterReplayAction.RECORD if mode == "record"
                                                          else RouterReplayAction.REPLAY_FORWARD)
        if mode != "replay":
            return
        routes = mb.batch[ROUTES]
        if tuple(routes.shape[2:]) != (len(self.routers), self.config.moe_router_topk):
            raise ValueError(f"{ROUTES} of shape {tuple(routes.shape)} for a model of {len(self.routers)} MoE layers, "
                             f"top-{self.config.moe_router_topk}")
        device = inputs.input_ids.device
        tokens = _model_order(routes.to(device).long(), mb.batch["attention_mask"].to(device).bool(), inputs)
        if self.sp:  # this TP rank's contiguous share of the s-major tokens
            tokens = tokens.chunk(self.config.tensor_model_parallel_size)[mpu.get_tensor_model_parallel_rank()]
        for layer, router in enumerate(self.routers):
            router.router_replay.set_target_indices(tokens[:, layer].contiguous())

    def recorded(self, mb, inputs: ModelInputs) -> torch.Tensor:
        """This forward's routes as `[batch, seq, layers, top_k]` int16 (on every TP rank)."""
        tokens = torch.stack([r.router_replay.get_recorded_indices() for r in self.routers], dim=1)  # [tokens, L, k]
        if self.sp:
            tokens = gather_from_sequence_parallel_region(tokens, group=mpu.get_tensor_model_parallel_group())
        mask = mb.batch["attention_mask"].to(tokens.device).bool()
        return _batch_order(tokens, mask, inputs, mask.shape[1]).to(ROUTE_DTYPE)

    def after(self) -> None:
        """Back to free routing, nothing kept."""
        for router in self.routers:
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(None)
