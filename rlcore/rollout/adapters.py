"""LoRA adapters applied by the native engine over its frozen base (`model.lora.merge=False`): each adapted linear
computes x W^T + s (x A^T) B^T, so a sync replaces megabytes of A and B instead of the merged weights.

Several named adapters can be held over the one base (multi-LoRA); a generate() call uses one of them
(`SamplingParams.adapter`, default: the policy's). With `merge` (the engine's `merge_adapters`) the adapter in use
is merged into the weights instead, from a kept copy of the adapted base weights: decode at merged speed for the
memory of that copy and a merge per sync or switch of adapter. The HF modules get the delta through a forward hook; the fused
decoder, whose q/k/v and gate/up projections are single stacked GEMMs, asks for the stacked delta: one GEMM against
the parts' A stacked (`[parts x r, in]`), then each part's B on its slice.

A sync copies the new factors into the held tensors when the shapes agree (no allocation per step). A CUDA graph
bakes in which tensors a forward reads, and the stacked A's are rebuilt at each load, so the engine drops its
captured graphs at every load and every switch of adapter; the next decode captures them again (rlcore.rollout.native;
not run on a GPU yet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlcore.models.lora import ADAPTER, Adapters


class HeldAdapters:
    """The named adapters an engine's model holds (factors in the engine's device and dtype) and which one is in use."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype, merge: bool = False) -> None:
        self.device, self.dtype = device, dtype
        # merge: the adapter in use is merged into the weights (merged decode speed) from a copy of the adapted base
        # weights, kept to merge the next factors from exactly
        self.merge, self.base, self.merged = merge, {}, None
        self.linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.held: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}  # adapter -> module -> (A, B)
        self.scaling: dict[str, float] = {}
        self.stacked: dict[str, dict[tuple[str, ...], torch.Tensor]] = {}  # adapter -> parts -> A of the parts stacked
        self.active: str | None = None
        self._hooked: set[str] = set()

    def load(self, adapters: Adapters) -> None:
        """Holds `adapters` under its name (replacing the factors of one already held by that name)."""
        unknown = [m for m in adapters.modules if m not in self.linears]
        if unknown:
            raise KeyError(f"LoRA adapter {adapters.name!r} adapts {unknown[:3]}, which the rollout model has no linear for; "
                           "the training and rollout architectures differ")
        held = self.held.setdefault(adapters.name, {})
        for module in adapters.modules:
            a, b = (t.to(self.device, self.dtype) for t in adapters.pair(module))
            if module in held and held[module][0].shape == a.shape and held[module][1].shape == b.shape:
                held[module][0].copy_(a)
                held[module][1].copy_(b)
            else:
                held[module] = (a.clone(), b.clone())
            if module not in self._hooked:
                self.linears[module].register_forward_hook(self._hook(module))
                self._hooked.add(module)
        for gone in set(held) - set(adapters.modules):
            del held[gone]
        self.scaling[adapters.name] = adapters.scaling
        # The fused decoder's stacked A's, built here rather than at a forward's first call: a CUDA graph being
        # captured must not allocate them
        self.stacked[adapters.name] = {parts: torch.cat([held[m][0] for m in parts if m in held])
                                       for parts in _fused_parts(held) if any(m in held for m in parts)}
        if self.active is None:
            self.active = ADAPTER if ADAPTER in self.held else adapters.name
        if self.merge and adapters.name == self.active:
            self._merge_active()

    def remove(self, name: str) -> None:
        self.held.pop(name, None)
        self.stacked.pop(name, None)
        if self.active == name:
            self.active = None

    def use(self, name: str | None) -> bool:
        """Makes `name` (None: the policy's, "default") the adapter forwards apply; returns whether that changed."""
        name = name or ADAPTER
        if name not in self.held:
            raise KeyError(f"the rollout holds no LoRA adapter named {name!r} (it holds {sorted(self.held)})")
        changed, self.active = self.active != name, name
        if changed and self.merge:
            self._merge_active()
        return changed

    def forget_base(self) -> None:
        """The weights were overwritten (a sync of the base): they hold no adapter now, and no copy of them is kept."""
        self.base, self.merged = {}, None

    @torch.no_grad()
    def _merge_active(self) -> None:
        """Weights := base + s B A for the adapter in use (in fp32, cast to the weights' dtype); the base back where
        the previously merged adapter touched a module this one does not."""
        held = self.held.get(self.active, {})
        for module in set(self.base) | set(held):
            weight = self.linears[module].weight
            if module not in self.base:
                self.base[module] = weight.detach().clone()
            if module in held:
                a, b = held[module]
                weight.copy_(torch.addmm(self.base[module].float(), b.float(), a.float(), alpha=self.scaling[self.active]))
            else:
                weight.copy_(self.base[module])
        self.merged = self.active

    @property
    def nbytes(self) -> int:
        factors = sum(t.numel() * t.element_size() for held in self.held.values() for pair in held.values() for t in pair)
        return factors + sum(t.numel() * t.element_size() for t in self.base.values())

    def delta(self, module: str, x: torch.Tensor) -> torch.Tensor | None:
        """s (x A^T) B^T of the adapter in use at `module`, or None where it does not adapt it."""
        pair = self.held.get(self.active, {}).get(module) if self.active and not self.merge else None
        if pair is None:
            return None
        return F.linear(F.linear(x, pair[0]), pair[1]) * self.scaling[self.active]

    def stacked_delta(self, modules: tuple[str, ...], x: torch.Tensor) -> torch.Tensor | None:
        """The deltas of `modules` (a fused GEMM's parts, in its output order) side by side: x against their A's
        stacked in one GEMM, then each part's B on its slice. None where the adapter adapts none of them; a part it
        does not adapt gets zeros of that linear's width."""
        held = self.held.get(self.active, {}) if self.active and not self.merge else {}
        if not any(m in held for m in modules):
            return None
        hidden = F.linear(x, self.stacked[self.active][modules])
        parts, offset = [], 0
        for m in modules:
            if m in held:
                a, b = held[m]
                parts.append(F.linear(hidden[..., offset:offset + a.shape[0]], b))
                offset += a.shape[0]
            else:
                parts.append(x.new_zeros(*x.shape[:-1], self.linears[m].out_features))
        return torch.cat(parts, dim=-1) * self.scaling[self.active]

    def _hook(self, module: str):
        def hook(_linear, inputs, output):
            delta = self.delta(module, inputs[0])
            return output if delta is None else output + delta
        return hook


def _fused_parts(held: dict) -> set[tuple[str, ...]]:
    """The (q, k, v) and (gate, up) projections of every block an adapter touches, named as the fused decoder
    stacks them (rlcore.rollout.fused)."""
    out = set()
    for module in held:
        parent, _, leaf = module.rpartition(".")
        if leaf in ("q_proj", "k_proj", "v_proj"):
            out.add(tuple(f"{parent}.{p}_proj" for p in "qkv"))
        elif leaf in ("gate_proj", "up_proj"):
            out.add((f"{parent}.gate_proj", f"{parent}.up_proj"))
    return out
