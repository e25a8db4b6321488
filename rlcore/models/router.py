"""The routers of a mixture of experts, watched and steered: routes recorded, routes replayed, load and entropy
measured, the load-balancing loss computed, all through forward hooks on each layer's router.

Where a family's router sits and how it weighs the experts it picks is the family's fact (rlcore.families:
`Family.router`): Qwen's `mlp.gate` softmaxes every logit, DeepSeek-V3's and GLM-4.5's take sigmoid scores,
GPT-OSS's `mlp.router` softmaxes its top-k logits. Every one of them maps the layer's hidden states
`[tokens, hidden]` to `(logits [tokens, experts], weights [tokens, top_k], indices [tokens, top_k])`; the experts
then run each token through its `indices` weighted by `weights`. Replaying routes (router replay, R2/R3) swaps in
recorded `indices` and recomputes their weights from this forward's own logits by the family's rule, so the router
keeps its gradient while the tokens go to the experts that sampled them.

Routes travel as `routed_experts` `[batch, seq, moe_layers, top_k]` int16, aligned with `input_ids`: the route of
every input token (a prompt's too: its states feed the response's attention) through each layer that routes (a
dense first layer has none).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from rlcore.families import family_of
from rlcore.families.base import Router

ROUTES = "routed_experts"
ROUTE_DTYPE = torch.int16


def router_facts(model: torch.nn.Module) -> Router | None:
    """The family's router facts (rlcore.families); None for a dense model or a family without a module."""
    family = family_of(model.config.to_dict())
    return family.router if family is not None else None


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each MoE layer's router, in layer order; [] for a dense model (or a MoE family rlcore has no module for)."""
    facts = router_facts(model)
    if facts is None:
        return []
    suffix = "." + facts.module
    return [m for name, m in model.named_modules() if name.endswith(suffix) and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def replayed_weights(router: torch.nn.Module, scoring: str, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The weights `[tokens, top_k]` the family's router gives experts `indices` from its `logits` (in the logits'
    dtype), for forced indices: the same function HF's router applies to the indices it picks itself."""
    if scoring == "topk_softmax":  # GPT-OSS: a softmax over the chosen logits only
        return torch.softmax(logits.gather(-1, indices), dim=-1, dtype=logits.dtype)
    if scoring == "sigmoid":  # DeepSeek-V3, GLM-4.5: the correction bias chose; the plain sigmoid scores weigh
        weights = logits.float().sigmoid().gather(-1, indices)
        if router.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return (weights * router.routed_scaling_factor).to(logits.dtype)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, indices)
    if getattr(router, "norm_topk_prob", False):
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype)


@dataclass
class _Pass:
    """What one forward asked of the routers and what they left."""

    replay: torch.Tensor | None = None          # [tokens, layers, top_k] routes to force
    valid: torch.Tensor | None = None           # [tokens] bool: the tokens that count in metrics and the aux loss
    record: bool = False
    aux: bool = False
    count: bool = False                         # add this forward's load to metrics()
    counted: set[int] = field(default_factory=set)
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> [tokens, top_k]
    aux_losses: dict[int, tuple] = field(default_factory=dict)  # layer -> load_balancing_terms (with grad)


class Routing:
    """Hooks on every router of `model`. Outside `run()` the routers route freely and nothing is kept. A training
    forward keeps its `run()` open through its backward: a checkpointed layer's recompute must replay the same
    routes (and must not count its tokens twice)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE router rlcore knows (a family module's Router: rlcore/families/)")
        self.scoring = router_facts(model).scoring
        self.num_layers, self.top_k = len(self.routers), self.routers[0].top_k
        self.num_experts = self.routers[0].num_experts
        self._pass: _Pass | None = None
        # Summed on the routers' device over the training forwards and read once by metrics(): no host sync per layer.
        self._load: torch.Tensor | None = None     # [layers, experts] tokens routed to each expert
        self._entropy: torch.Tensor | None = None  # [2]: the tokens' summed router entropy, the tokens
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    @contextmanager
    def run(self, replay: torch.Tensor | None = None, valid: torch.Tensor | None = None, record: bool = False, aux: bool = False,
            count: bool = False):
        """Within it, one forward (and its backward): replays `replay` `[tokens, layers, top_k]` (the tokens in the
        order the model sees them), records routes (`.recorded`), computes each layer's load-balancing loss
        (`.aux_losses`), adds the load to `metrics()` (`count`). `valid` `[tokens]`: the tokens that count."""
        if replay is not None and tuple(replay.shape[1:]) != (self.num_layers, self.top_k):
            raise ValueError(f"{ROUTES} of shape {tuple(replay.shape)} for a model of {self.num_layers} MoE layers, top-{self.top_k}")
        self._pass = _Pass(replay=replay, valid=valid, record=record, aux=aux, count=count)
        try:
            yield self._pass
        finally:
            self._pass = None

    def _hook(self, layer: int):
        def hook(router, inputs, output):
            logits, scores, indices = output
            p = self._pass
            if p is not None and p.replay is not None:
                indices = p.replay[:, layer].to(device=indices.device, dtype=indices.dtype)
                scores = replayed_weights(router, self.scoring, logits, indices)
            if p is None:
                return logits, scores, indices
            if p.record:
                # A checkpointed layer runs twice (forward, then recompute in backward): keyed by layer, the second
                # run writes the same routes again.
                p.recorded[layer] = indices.detach()
            terms = None
            if p.aux:
                p.aux_losses[layer] = terms = load_balancing_terms(logits, indices, self.num_experts, p.valid)
            if p.count and layer not in p.counted:  # the recompute's tokens are not counted again
                p.counted.add(layer)
                self._count(layer, logits.detach(), indices, terms, p.valid)
            return logits, scores, indices

        return hook

    @torch.no_grad()  # outside autograd: a checkpointed layer's recompute, which does not count, must save the same tensors
    def _count(self, layer: int, logits: torch.Tensor, indices: torch.Tensor, terms: tuple | None, valid: torch.Tensor | None) -> None:
        """Adds this layer's routed tokens and router entropy; `terms`: the load-balancing terms already computed."""
        routed, _, tokens = terms or load_balancing_terms(logits, indices, self.num_experts, valid)
        if self._load is None:
            self._load = torch.zeros(self.num_layers, self.num_experts, dtype=torch.float64, device=logits.device)
            self._entropy = torch.zeros(2, dtype=torch.float64, device=logits.device)
        log_probs = torch.log_softmax(logits.float(), -1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        self._load[layer] += routed.detach()
        self._entropy += torch.stack([(entropy * token_weights(valid, entropy)).sum(), tokens.detach()]).double()

    def metrics(self) -> dict[str, float]:
        """Since the last call, over the training forwards: each layer's load balance (the busiest expert's tokens
        over the mean, 1 = perfectly even, num_experts = one expert takes all) and the mean router entropy in nats
        (ln num_experts = uniform). HF's Qwen MoE experts have no capacity: no token is dropped."""
        if self._load is None:
            return {}
        load, (entropy, tokens) = self._load.cpu(), self._entropy.tolist()
        self._load = self._entropy = None
        if tokens == 0:
            return {}
        balance = load.max(-1).values / load.mean(-1).clamp(min=1e-12)
        out = {f"moe/load_max_over_mean/layer_{i}": float(b) for i, b in enumerate(balance)}
        out.update({"moe/load_max_over_mean": float(balance.mean()), "moe/router_entropy": entropy / tokens})
        return out


def token_weights(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """1.0 for each token that counts, 0.0 for the others `[tokens]`: a mask applied by weighting, not by indexing
    (boolean indexing reads the count back to the host)."""
    return torch.ones(like.shape[0], device=like.device) if valid is None else valid.to(like.device, torch.float32)


def load_balancing_terms(logits: torch.Tensor, indices: torch.Tensor, num_experts: int,
                         valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's part of the load-balancing loss: (tokens routed to each expert `[experts]`, the sum of each
    expert's router probability `[experts]`, tokens), over the tokens that count. `logits` `[tokens, experts]`,
    `indices` `[tokens, top_k]`, `valid` `[tokens]` bool."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights = token_weights(valid, probs)
    routed = probs.new_zeros(num_experts).scatter_add_(0, indices.reshape(-1).long(), weights.repeat_interleave(indices.shape[-1]))
    return routed, (probs * weights[:, None]).sum(0), weights.sum()


def aux_loss(terms: dict[int, tuple], num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss as HF's Qwen MoE computes it (load_balancing_loss_func, pooled over the
    layers): num_experts x sum over experts of (tokens routed to it per token) x (its mean router probability);
    top_k when perfectly balanced, more when some experts take most tokens."""
    routed, probs, tokens = (sum(parts) for parts in zip(*terms.values()))
    return num_experts * ((routed / tokens) * (probs / tokens)).sum()


def to_routes(recorded: dict[int, torch.Tensor], num_layers: int) -> torch.Tensor:
    """The per-layer routes of one forward as `[tokens, layers, top_k]` int16."""
    return torch.stack([recorded[layer] for layer in range(num_layers)], dim=1).to(ROUTE_DTYPE)
