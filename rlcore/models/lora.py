"""LoRA adapters through peft: wrapping a loaded HF model, and the weight stream the rollout engine receives.

peft renames what it wraps: `model.layers.0.self_attn.q_proj.weight` becomes
`base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight` beside `...q_proj.lora_A.default.weight` and
`...lora_B.default.weight`; a module kept whole and trained (`modules_to_save`, the critic's value head) keeps a
frozen `original_module` beside the trained `modules_to_save.default` copy. The rollout engine knows only HF names,
so `merged_weights` turns that stream back into HF names with each adapted weight merged, W + scaling * B @ A,
computed tensor by tensor as the stream passes (the training model itself is never merged). Without merging
(`model.lora.merge=False`, verl's default) the rollout gets the frozen base once (`base_weights`) and then, every
sync, the adapters alone as an `Adapters` (megabytes where the merged model is gigabytes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

PREFIX = "base_model.model."
ADAPTER = "default"  # peft's name for the one adapter rlcore trains
VALUE_HEAD = "score"  # the critic's head (rlcore.models.hf.load_value_model)


@dataclass(frozen=True)
class LoraSpec:
    """verl's `model.lora_rank`, `lora_alpha`, `target_modules` (and `lora_adapter_path`: start from a saved one)."""

    rank: int
    alpha: float = 16
    target_modules: str | tuple[str, ...] = "all-linear"
    adapter_path: str | None = None
    exclude_modules: str | tuple[str, ...] | None = None  # layers never adapted (peft's regex / names; Megatron's names)
    init_a: str = "kaiming"  # A's init (Megatron: model.lora.lora_A_init_method; peft always kaiming-uniform)


def import_peft():
    try:
        import peft
    except ImportError as e:  # a core dependency, but a user's own environment may lack it
        raise ImportError("model.lora_rank > 0 needs peft: pip install 'peft>=0.21,<0.22'") from e
    return peft


def apply_lora(model: torch.nn.Module, spec: LoraSpec, value_head: bool = False) -> torch.nn.Module:
    """The model wrapped by peft: adapters (fp32) on `spec.target_modules`, every base weight frozen. A critic also
    trains its whole value head (it starts from random unless the model is a reward model)."""
    peft = import_peft()
    if spec.adapter_path:
        path = os.path.abspath(os.path.expanduser(spec.adapter_path))
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise FileNotFoundError(f"model.lora_adapter_path={spec.adapter_path!r}: no adapter_config.json in {path} "
                                    "(a directory written by peft's save_pretrained, e.g. a checkpoint's actor/lora_adapter)")
        wrapped = peft.PeftModel.from_pretrained(model, path, is_trainable=True)
    else:
        targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
        config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                                 modules_to_save=[VALUE_HEAD] if value_head else None,
                                 exclude_modules=list(spec.exclude_modules) if isinstance(spec.exclude_modules, tuple) else spec.exclude_modules)
        wrapped = peft.get_peft_model(model, config)
    for param in wrapped.parameters():
        if param.requires_grad:
            # Adapters train in fp32 whatever the frozen base is stored in (model_dtype=bf16 halves the base).
            param.data = param.data.float()
    return wrapped


def initial_adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole initial values of every adapter factor of a peft model built on the meta device (where peft's own
    initialisation drew nothing): A as peft draws it (kaiming-uniform, a=sqrt(5)), B zero, so the adapted model
    starts as the base. A is r rows, small: every rank draws it whole from the same RNG stream and keeps its shard."""
    out = {}
    for name, param in model.named_parameters():
        if f".lora_A.{ADAPTER}." in name:
            out[name] = torch.nn.init.kaiming_uniform_(torch.empty(param.shape, dtype=param.dtype), a=math.sqrt(5))
        elif f".lora_B.{ADAPTER}." in name:
            out[name] = torch.zeros(param.shape, dtype=param.dtype)
    return out


def scalings(model: torch.nn.Module) -> dict[str, float]:
    """{peft module name: alpha / r} of every adapted linear (rsLoRA or a loaded adapter may differ per module)."""
    return {name: module.scaling[ADAPTER] for name, module in model.named_modules() if hasattr(module, "lora_A") and ADAPTER in getattr(module, "scaling", {})}


def is_adapted(name: str) -> bool:
    """True for the tensors a merged adapted weight is made of (its base weight and the two adapter factors)."""
    return name.endswith(".base_layer.weight") or is_factor(name)


def hf_name(name: str) -> str | None:
    """The HF name of a non-adapter tensor of a peft model (None: a frozen copy nothing downstream wants)."""
    name = name.removeprefix(PREFIX)
    if ".original_module." in name:
        return None
    return name.replace(f".modules_to_save.{ADAPTER}.", ".").replace(".base_layer.", ".")


def merged_weights(named: Iterable[tuple[str, torch.Tensor]], scaling: dict[str, float], transient: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors from a peft model's (name, full tensor) stream in state-dict order: every adapted
    weight comes out once its base, A and B have passed, as `W + scaling * B @ A` in fp32 (a bf16 base plus a
    small update rounded back to bf16 would lose the update); the rest is renamed. `transient`: the stream reuses
    its buffers, so the parts held until their module is complete are copied."""
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        if not is_adapted(name):
            out = hf_name(name)
            if out is not None:
                yield out, tensor
            continue
        module, part = _split(name)
        parts = held.setdefault(module, {})
        parts[part] = tensor.clone() if transient else tensor
        if len(parts) == 3:
            del held[module]
            w, a, b = parts["W"].float(), parts["A"].float(), parts["B"].float()
            yield hf_name(module) + ".weight", torch.addmm(w, b, a, alpha=scaling[module])
    if held:
        raise RuntimeError(f"LoRA weight stream ended with incomplete modules: {sorted(held)}")


def is_factor(name: str) -> bool:
    """True for an adapter factor (A or B) of the adapter rlcore trains."""
    return f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name


def base_weights(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The frozen base of a peft model's stream under HF names, adapters left out and nothing merged: what a rollout
    that applies the adapters itself holds."""
    for name, tensor in named:
        out = None if is_factor(name) else hf_name(name)
        if out is not None:
            yield out, tensor


@dataclass
class Adapters:
    """One LoRA adapter as a rollout engine takes it: `tensors` under peft's saved names without its prefix,
    `<HF module>.lora_A.weight` `[r, in]` and `<HF module>.lora_B.weight` `[out, r]`, full (unsharded), for every
    adapted linear; each computes x W^T + (alpha / rank) (x A^T) B^T. `name` tells adapters held side by side apart
    (multi-LoRA); the policy's is "default"."""

    tensors: dict[str, torch.Tensor]
    rank: int
    alpha: float
    name: str = ADAPTER

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @property
    def modules(self) -> list[str]:
        """The adapted linears' HF module names, in the order their tensors came."""
        return list(dict.fromkeys(n.rsplit(".lora_", 1)[0] for n in self.tensors))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def pair(self, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensors[f"{module}.lora_A.weight"], self.tensors[f"{module}.lora_B.weight"]

    def peft_config(self) -> dict:
        """peft's adapter_config.json for these tensors (what vLLM's LoRA loader reads)."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha, "lora_dropout": 0.0,
                "bias": "none", "target_modules": sorted({m.rsplit(".", 1)[-1] for m in self.modules})}


def adapters_of(named: Iterable[tuple[str, torch.Tensor]], scaling: dict[str, float], rank: int) -> Adapters:
    """An `Adapters` from a peft model's (name, full tensor) stream of its adapter factors. One scaling for every
    module (peft's alpha / r): a per-module rank or alpha (rank_pattern, rsLoRA) is refused with the fix."""
    if len(set(scaling.values())) > 1:
        raise ValueError(f"LoRA adapters with different scalings per module ({sorted(set(scaling.values()))}) cannot be sent "
                         "unmerged; set actor_rollout_ref.model.lora.merge=True")
    tensors = {}
    for name, tensor in named:
        module, part = _split(name)
        tensors[f"{module.removeprefix(PREFIX)}.lora_{part}.weight"] = tensor.detach().clone()
    return Adapters(tensors, rank, next(iter(scaling.values())) * rank)


def _split(name: str) -> tuple[str, str]:
    if name.endswith(".base_layer.weight"):
        return name.removesuffix(".base_layer.weight"), "W"
    part = "A" if f".lora_A.{ADAPTER}." in name else "B"
    return name.split(f".lora_{part}.")[0], part


def adapter_state(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The trained tensors (full, from `named`) under the names peft saves them with (its own mapping)."""
    peft = import_peft()
    trained = {name: tensor.detach().cpu().contiguous() for name, tensor in named}
    return peft.get_peft_model_state_dict(model, state_dict=trained, adapter_name=ADAPTER)


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], out_dir: str, base_model_path: str) -> None:
    """peft's on-disk format, adapter_model.safetensors + adapter_config.json, loadable by
    `peft.PeftModel.from_pretrained(base, out_dir)` (rank 0 calls it)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file(state, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = model.peft_config[ADAPTER]
    config.base_model_name_or_path = base_model_path
    config.save_pretrained(out_dir)


def trainable_share(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
