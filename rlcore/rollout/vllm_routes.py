"""A mixture of experts' routes recorded inside vLLM (R3 router replay with `rollout.name=vllm`).

vLLM 0.32's own route capture (`enable_return_routed_experts`) runs only in its GPU Model Runner V2; its CPU build
never fills it. Every vLLM MoE layer's router does take a `capture_fn` that it calls with the experts it picked for
each token of a forward (`[tokens, top_k]`, before any expert-parallel remapping), so rlcore binds its own on the
worker and attributes the rows itself: a forward lays out its tokens request by request, in the model runner's
`input_batch.req_ids` order, `scheduler_output.num_scheduled_tokens[req]` tokens each, at the positions the runner
wrote to `positions`. Prefill chunks and decode steps alike land at their positions, so a request ends with the
route of every token it fed the model: its prompt and each sampled token but the last (which no forward reads).

Two things would leave holes, and the adapter rules both out when it records: a prompt prefix served from vLLM's
prefix cache is never computed (prefix caching is off), and a callback bound after vLLM compiled or captured its
forward is never called (`enforce_eager=True`). A hole left anyway is an error, not a zero route.

In-process only (the adapter's layout): `collective_rpc` hands this process's worker to `install`, and the recorder
it returns is read directly.
"""

from __future__ import annotations

import numpy as np
import torch

from rlcore.models.router import ROUTE_DTYPE


class RouteRecorder:
    """Bound to one vLLM worker: the routes of every request since `clear()`, by vLLM's request id."""

    def __init__(self, worker) -> None:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        runners = [m for m in worker.model_runner.get_model().modules() if isinstance(m, MoERunner)]
        if not runners or not all(hasattr(m.router, "set_capture_fn") for m in runners):
            raise ValueError("actor_rollout_ref.rollout.enable_rollout_routing_replay=True: this vLLM build's MoE layers take no route "
                             "callback (vLLM 0.32's routers do); use actor_rollout_ref.rollout.name=native")
        # A router's layer_id is its decoder layer; rlcore numbers the MoE layers only (a model may mix in dense ones).
        layer_ids = sorted({m.layer_id for m in runners})
        self.num_layers, self.top_k = len(layer_ids), int(runners[0].router.top_k)
        self._step: dict[int, torch.Tensor] = {}  # MoE layer -> [tokens, top_k] of the forward running now
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # request -> [(positions, routes [n, layers, k])]
        for m in runners:
            m.router.set_capture_fn(self._capture(layer_ids.index(m.layer_id)))
        self._runner = worker.model_runner
        forward = self._runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            self._step.clear()
            result = forward(scheduler_output, *args, **kwargs)
            self._attribute(scheduler_output)
            return result

        self._runner.execute_model = execute_model

    def _capture(self, layer: int):
        def capture(topk_ids: torch.Tensor) -> None:
            self._step[layer] = topk_ids.detach()
        return capture

    def _attribute(self, scheduler_output) -> None:
        """The forward that just ran: its tokens' routes, cut into the scheduled requests' rows."""
        counts = scheduler_output.num_scheduled_tokens
        total = sum(counts.values())
        if total == 0 or not self._step:
            return
        if len(self._step) != self.num_layers:
            raise RuntimeError(f"vLLM routed {len(self._step)} of {self.num_layers} MoE layers in one forward; recorded routes would "
                               "have holes (was the forward compiled or graph-captured? set actor_rollout_ref.rollout.enforce_eager=True)")
        routes = torch.stack([self._step[layer][:total] for layer in range(self.num_layers)], dim=1).to("cpu", ROUTE_DTYPE).numpy()
        # A copy: on CPU `.cpu()` is the runner's own buffer, which the next step overwrites.
        positions = self._runner.positions[:total].cpu().numpy().copy()
        start = 0
        for req_id in self._runner.input_batch.req_ids:
            n = counts.get(req_id, 0)
            if n:
                self._parts.setdefault(req_id, []).append((positions[start : start + n], routes[start : start + n]))
                start += n

    def clear(self) -> None:
        self._parts.clear()

    def take(self, request_id: str, length: int) -> np.ndarray:
        """The routes of positions 0 .. length-1 of the request vLLM knows as `request_id` (its own suffix allowed),
        `[length, layers, top_k]`; forgets the request."""
        parts = [p for key in [k for k in self._parts if k == request_id or k.startswith(f"{request_id}-")] for p in self._parts.pop(key)]
        routes = np.zeros((length, self.num_layers, self.top_k), dtype=np.int16)
        seen = np.zeros(length, dtype=bool)
        for positions, rows in parts:
            keep = positions < length
            routes[positions[keep]], seen[positions[keep]] = rows[keep], True
        if not seen.all():
            raise RuntimeError(f"vLLM request {request_id}: no route recorded for positions {np.flatnonzero(~seen)[:8].tolist()} of {length} "
                               "(a prefix served from vLLM's prefix cache is never computed: set "
                               "actor_rollout_ref.rollout.enable_prefix_caching=False)")
        return routes


def install(worker) -> RouteRecorder:
    """Runs on the vLLM worker through `collective_rpc`."""
    return RouteRecorder(worker)
