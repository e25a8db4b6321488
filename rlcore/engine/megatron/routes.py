"""Router replay on megatron-core: record each MoE layer's routes in a forward, or force given routes in a forward,
through megatron-core 0.16's RouterReplay (TransformerConfig.moe_enable_routing_replay, one instance per router).

Routes travel as the batch field `routed_experts` `[batch, seq, layers, top_k]` int16 aligned with `input_ids`
(rlcore.models.router, the FSDP2 engine's format). megatron-core routes the tokens in its own order: the sequence
dimension first (`[s, b]` flattened, s-major), rows left-aligned (rlcore.engine.megatron.inputs), or the packed
(THD) valid tokens; under sequence parallelism each TP rank routes its contiguous 1/tp of those tokens. A replayed
route keeps the router's gradient: megatron-core gathers the live scores at the forced indices (and, for
top-k-then-softmax routers, normalises over them), as HF's hook in rlcore.models.router does.

Pipeline stages and recomputation: each stage replays its own layers' columns of the routes (a MoE layer's column
counts only the layers that route: DeepSeek-V3's first layers are dense; moe.moe_columns). megatron-core's RouterReplay replays a forward from the routes
set last and has a REPLAY_BACKWARD action that pops the oldest routes not yet recomputed, but nothing in megatron-core
switches between the two; rlcore queues every micro-batch's routes per router and a layer recomputed inside
autograd's backward pops its own (megatron-core's schedules run a stage's backwards in forward order). Recording
with pipeline stages (a forward-only pass): each stage keeps its layers' columns of every micro-batch, and after the
schedule they are summed over the pipeline group (every other column is zero) before the outputs are made.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
from megatron.core.transformer.moe.router_replay import RouterReplayAction

from rlcore.engine.megatron.inputs import ModelInputs
from rlcore.engine.megatron.moe import moe_columns
from rlcore.models.router import ROUTE_DTYPE, ROUTES
from rlcore.utils.dist import all_reduce

MODES = ("free", "record", "replay")


def layer_routers(chunks) -> list:
    """Each MoE layer's router of this rank's chunks, in layer order; [] for a dense model."""
    return [layer.mlp.router for chunk in chunks for layer in chunk.decoder.layers if hasattr(layer.mlp, "router")]


def check_mode(mode: str, config) -> None:
    if mode not in MODES:
        raise ValueError(f"routes={mode!r} is not one of {', '.join(MODES)}")
    if mode == "free":
        return
    if not config.num_moe_experts:  # (a pipeline stage of only dense layers has no routers of its own: it passes)
        raise ValueError(f"router replay ({mode}) on a model without MoE routers: set actor_rollout_ref.actor.router_replay.mode=disabled")


def queue_recomputed_routes(replay) -> None:
    """Makes one router's RouterReplay replay a layer recomputed in backward from its own micro-batch's routes: inside
    autograd's backward a REPLAY_FORWARD router takes megatron-core's REPLAY_BACKWARD path, which pops the oldest
    routes `set_target_indices` queued. A layer that is never recomputed never pops; its queue goes at `start`."""
    replay_topk = replay.get_replay_topk

    def get_replay_topk(*args, **kwargs):
        if replay.router_replay_action != RouterReplayAction.REPLAY_FORWARD or torch._C._current_graph_task_id() == -1:
            return replay_topk(*args, **kwargs)
        replay.router_replay_action = RouterReplayAction.REPLAY_BACKWARD
        try:
            return replay_topk(*args, **kwargs)
        finally:
            replay.router_replay_action = RouterReplayAction.REPLAY_FORWARD

    replay.get_replay_topk = get_replay_topk


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
    """Sets this rank's routers for one schedule (`start`) and each micro-batch's forward (`before`, right before a
    model chunk runs), and reads what they recorded (`recorded`, in the loss function of the same micro-batch)."""

    def __init__(self, chunks, config) -> None:
        self.routers = layer_routers(chunks)
        # Per model chunk (virtual pipeline stage): its routers and their layers' columns in the routes.
        columns = moe_columns(config)
        self.columns = len(columns)
        self.chunk_routers = [[(layer.mlp.router, columns[layer.layer_number - 1]) for layer in chunk.decoder.layers
                               if hasattr(layer.mlp, "router")] for chunk in chunks]
        self.config = config
        self.sp = config.sequence_parallel and config.tensor_model_parallel_size > 1
        self._stages: dict[int, torch.Tensor] = {}  # micro-batch -> its routes, this stage's columns (record, PP > 1)
        for router in self.routers:
            queue_recomputed_routes(router.router_replay)

    def start(self, mode: str, forward_only: bool) -> None:
        check_mode(mode, self.config)
        self._stages.clear()
        # Only a layer recomputed in backward reads the queue; elsewhere it would hold every micro-batch's routes.
        self._queue = not forward_only and self.config.recompute_granularity is not None
        action = None if mode == "free" else RouterReplayAction.RECORD if mode == "record" else RouterReplayAction.REPLAY_FORWARD
        for router in self.routers:
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(action)

    def before(self, mode: str, mb, inputs: ModelInputs, chunk: int = 0) -> None:
        if mode != "replay":
            return
        routes = mb.batch[ROUTES]
        if tuple(routes.shape[2:]) != (self.columns, self.config.moe_router_topk):
            raise ValueError(f"{ROUTES} of shape {tuple(routes.shape)} for a model of {self.columns} MoE layers, "
                             f"top-{self.config.moe_router_topk}")
        device = inputs.input_ids.device
        tokens = _model_order(routes.to(device).long(), mb.batch["attention_mask"].to(device).bool(), inputs)
        if self.sp:  # this TP rank's contiguous share of the s-major tokens
            tokens = tokens.chunk(self.config.tensor_model_parallel_size)[mpu.get_tensor_model_parallel_rank()]
        for router, layer in self.chunk_routers[chunk]:
            router.router_replay.set_target_indices(tokens[:, layer].contiguous())  # queued for a recompute too
            if not self._queue:
                router.router_replay.replay_backward_list.clear()

    def recorded(self, mb, inputs: ModelInputs, routers: list | None = None) -> torch.Tensor:
        """This forward's routes as `[batch, seq, layers, top_k]` int16 (on every TP rank), of `routers` (all)."""
        tokens = torch.stack([r.router_replay.get_recorded_indices() for r in routers or self.routers], dim=1)  # [tokens, L, k]
        if self.sp:
            tokens = gather_from_sequence_parallel_region(tokens, group=mpu.get_tensor_model_parallel_group())
        mask = mb.batch["attention_mask"].to(tokens.device).bool()
        return _batch_order(tokens, mask, inputs, mask.shape[1]).to(ROUTE_DTYPE)

    def keep_stage(self, index: int, mb, inputs: ModelInputs, chunk: int) -> None:
        """Pipeline stages: right after a chunk's forward of micro-batch `index`, its layers' columns of the routes."""
        routers = self.chunk_routers[chunk]
        if not routers:
            return
        mask = mb.batch["attention_mask"]
        # On the host, as the outputs will be: a pass's routes of every layer would crowd the device until the end.
        full = self._stages.setdefault(index, torch.zeros(*mask.shape, self.columns, self.config.moe_router_topk, dtype=ROUTE_DTYPE))
        full[:, :, [layer for _, layer in routers]] = self.recorded(mb, inputs, [r for r, _ in routers]).cpu()

    def stage_routes(self, micro_batches: list) -> list[torch.Tensor]:
        """Every micro-batch's routes of all layers `[batch, seq, layers, top_k]` int16 on the host, summed over the
        pipeline group from the stages' columns (collective: every rank of a replica calls it). They travel as int32:
        neither NCCL nor gloo reduces int16."""
        out = []
        for index, mb in enumerate(micro_batches):
            mask = mb.batch["attention_mask"]
            full = self._stages.pop(index, None)
            if full is None:  # a stage without MoE layers
                full = torch.zeros(*mask.shape, self.columns, self.config.moe_router_topk, dtype=ROUTE_DTYPE)
            out.append(all_reduce(full.int(), group=mpu.get_pipeline_model_parallel_group()).to(ROUTE_DTYPE))
        return out

    def after(self) -> None:
        """Back to free routing, nothing kept."""
        for router in self.routers:
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(None)


class RouterLoad:
    """The FSDP2 engine's per-step MoE metrics (rlcore.models.router.Routing.metrics) on megatron-core's routers: each
    layer's load balance (the busiest expert's tokens over the mean) and the mean router entropy, over the tokens
    that count of the training forwards since the last call. A hook on each router reads its routing map and (via
    its gating) its logits; under sequence parallelism each TP rank routes a slice of the tokens and pipeline stages
    route their own layers, so the counts are summed over both groups before the ratios."""

    def __init__(self, chunks, config) -> None:
        self.config = config
        columns = moe_columns(config)  # HF's numbering: the layers that route
        self.columns = max(len(columns), 1)
        self.layers = [columns[layer.layer_number - 1] for chunk in chunks for layer in chunk.decoder.layers if hasattr(layer.mlp, "router")]
        self.sp = config.sequence_parallel and config.tensor_model_parallel_size > 1
        self.valid: torch.Tensor | None = None  # this rank's routed tokens that count; None: not counting
        self._load = self._entropy = None
        for index, router in zip(self.layers, layer_routers(chunks)):
            gating = router.gating

            def keep_logits(x, gating=gating, router=router):
                router.rlcore_logits = gating(x)
                return router.rlcore_logits

            router.gating = keep_logits
            router.register_forward_hook(lambda module, args, output, index=index: self._count(index, module, output))

    def before(self, mb, inputs: ModelInputs, count: bool) -> None:
        """Count the next forward's routes (a training forward) or not; call `after_forward` once it has run, so a
        recomputation in backward is not counted again."""
        self.valid = None
        if not count or not self.layers:
            return
        mask = mb.batch["attention_mask"].to(inputs.input_ids.device).bool()
        valid = _model_order(mask.long()[..., None, None], mask, inputs)[:, 0, 0].bool()  # padding routes as expert 0
        self.valid = valid.chunk(self.config.tensor_model_parallel_size)[mpu.get_tensor_model_parallel_rank()] if self.sp else valid

    def after_forward(self) -> None:
        self.valid = None

    def _count(self, layer: int, router, output) -> None:
        if self.valid is None:
            return
        routing_map = output[1]  # [tokens, experts] bool
        weights = self.valid.to(routing_map.device, torch.float32)
        if self._load is None:
            self._load = torch.zeros(self.columns, routing_map.shape[-1], dtype=torch.float64, device=routing_map.device)
            self._entropy = torch.zeros(2, dtype=torch.float64, device=routing_map.device)
        self._load[layer] += (routing_map.float() * weights[:, None]).sum(0).double()
        logits = router.rlcore_logits.detach().float()
        probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)  # [s, b, experts] -> the map's [tokens, experts]
        entropy = -(probs * probs.clamp(min=1e-30).log()).sum(-1)
        self._entropy += torch.stack([(entropy * weights).sum(), weights.sum()]).double()

    def metrics(self) -> dict[str, float]:
        """Collective over the TP and PP groups (every rank of a replica calls it, a stage of dense layers too)."""
        if not self.config.num_moe_experts:
            return {}
        device = self._load.device if self._load is not None else torch.device("cpu")
        load = self._load if self._load is not None else torch.zeros(self.columns, self.config.num_moe_experts, dtype=torch.float64)
        entropy = self._entropy if self._entropy is not None else torch.zeros(2, dtype=torch.float64)
        self._load = self._entropy = None
        stacked = torch.cat([load.reshape(-1), entropy]).to(device)
        groups = [mpu.get_pipeline_model_parallel_group()] + ([mpu.get_tensor_model_parallel_group()] if self.sp else [])
        for group in groups:
            if torch.distributed.get_world_size(group) > 1:
                torch.distributed.all_reduce(stacked, group=group)
        load, (entropy_sum, tokens) = stacked[:-2].view(load.shape).cpu(), stacked[-2:].tolist()
        if tokens == 0:
            return {}
        balance = load.max(-1).values / load.mean(-1).clamp(min=1e-12)
        moe_layers = [i for i in range(len(load)) if load[i].sum() > 0]  # every stage's MoE layers, after the sums
        out = {f"moe/load_max_over_mean/layer_{i}": float(balance[i]) for i in moe_layers}
        out.update({"moe/load_max_over_mean": float(balance[moe_layers].mean()), "moe/router_entropy": entropy_sum / tokens})
        return out
