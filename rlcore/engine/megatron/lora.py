"""LoRA on megatron-core's tensor-parallel linears (verl's `actor_rollout_ref.model.lora.*` with strategy=megatron):
y = W x + (alpha / rank) B A x on linear_qkv, linear_proj, linear_fc1, linear_fc2 (or the layers the config names),
the base frozen, A and B trained.

Each adapter is laid out like its layer so that every rank's share is exact and the merged weight is local:
- column-parallel (qkv, fc1: output features split over TP): A `[r, in]` whole on every rank, B `[out / tp, r]` split
  like W. Every rank computes the same A x; its gradient is summed over the ranks' B shards (copy_to_tensor_model_
  parallel_region on A x), so A stays equal everywhere. With sequence parallelism the input is gathered first.
- row-parallel (proj, fc2: input features split): A `[r, in / tp]` split like W, B `[out, r]` whole. The ranks' A x
  are partial sums, reduced (or reduce-scattered, with sequence parallelism, which then all-reduces B's gradient
  like a layer norm's) before B.
Either way a rank's merged weight W + s B A is its shard of the merged full weight, so the HF export and the rollout
sync gather merged weights exactly as they gather plain ones (rlcore.engine.megatron.weights).
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
import zlib

import torch
from megatron.core import parallel_state as mpu
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, set_tensor_model_parallel_attributes
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

from rlcore.config.names import LORA_A_INITS
from rlcore.models.lora import LoraSpec

DENSE_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")  # verl's default target_modules
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


class Adapter(torch.nn.Module):
    """The trained pair of one linear, attached to it as `linear.adapter` (the base keeps its parameter names)."""

    def __init__(self, linear: torch.nn.Module, rank: int, alpha: float, a_init: str, seed: int) -> None:
        super().__init__()
        self.row = isinstance(linear, RowParallelLinear)
        self.scale = alpha / rank
        self.enabled = True
        self.sequence_parallel = bool(getattr(linear, "sequence_parallel", False))
        weight = linear.weight  # [out / tp, in] (column) or [out, in / tp] (row)
        tp, tp_rank = mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_rank()
        full_in = weight.shape[1] * (tp if self.row else 1)
        # The same full A on every rank (seeded by the layer's name), of which a row-parallel layer keeps its slice
        a = torch.empty(rank, full_in)
        generator = torch.Generator().manual_seed(seed)
        if a_init not in LORA_A_INITS:
            raise ValueError(f"model.lora.lora_A_init_method={a_init!r}; use one of {', '.join(LORA_A_INITS)}")
        if a_init == "xavier":
            std = math.sqrt(2.0 / (rank + full_in))
            a.normal_(0.0, std, generator=generator)
        else:  # kaiming uniform with a = sqrt(5): peft's (and torch.nn.Linear's) default
            bound = 1.0 / math.sqrt(full_in)
            a.uniform_(-bound, bound, generator=generator)
        if self.row:
            a = a.chunk(tp, dim=1)[tp_rank]
        out = weight.shape[0]
        self.lora_A = torch.nn.Parameter(a.to(device=weight.device, dtype=weight.dtype).contiguous())
        self.lora_B = torch.nn.Parameter(torch.zeros(out, rank, device=weight.device, dtype=weight.dtype))
        # The split one is a tensor-parallel parameter: megatron counts it on every rank in the grad norm (a whole
        # one, on TP rank 0 only) and checkpoints know its layout
        split = self.lora_A if self.row else self.lora_B
        set_tensor_model_parallel_attributes(split, is_parallel=True, dim=1 if self.row else 0, stride=1)
        if self.row and self.sequence_parallel:  # each rank's B gradient covers its sequence slice: summed over TP
            self.lora_B.sequence_parallel = True

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """s B A x, shaped like the layer's output on this rank."""
        if self.row:
            partial = x @ self.lora_A.t()
            reduced = (reduce_scatter_to_sequence_parallel_region(partial) if self.sequence_parallel
                       else reduce_from_tensor_model_parallel_region(partial))
            return reduced @ self.lora_B.t() * self.scale
        if self.sequence_parallel:  # the layer gathers its input itself; the adapter's gradient for it is whole
            x = gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False)
        hidden = copy_to_tensor_model_parallel_region(x @ self.lora_A.t())
        return hidden @ self.lora_B.t() * self.scale

    def merged(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's shard of W + s B A."""
        return weight + (self.lora_B.float() @ self.lora_A.float() * self.scale).to(weight.dtype)


def _wrap_forward(linear: torch.nn.Module) -> None:
    base_forward = linear.forward

    def forward(x, *args, **kwargs):
        out, bias = base_forward(x, *args, **kwargs)
        if linear.adapter.enabled:
            out = out + linear.adapter.delta(x)
        return out, bias

    linear.forward = forward


def targets(name: str, spec: LoraSpec) -> bool:
    """Whether the linear at `name` gets an adapter: a dense linear named by target_modules (a last name or an
    fnmatch pattern over the full name), or, with exclude_modules, every dense linear they do not name."""
    last = name.rsplit(".", 1)[-1]
    if last not in DENSE_LINEARS:
        return False
    named = lambda patterns: any(p == last or fnmatch.fnmatchcase(name, p) for p in patterns)  # noqa: E731
    if spec.exclude_modules:
        return not named(spec.exclude_modules)
    wanted = DENSE_LINEARS if spec.target_modules == "all-linear" else spec.target_modules
    return named(wanted)


def apply_lora(chunks: list[torch.nn.Module], spec: LoraSpec, seed: int) -> int:
    """Freezes every parameter and attaches adapters to the targeted linears; returns how many it adapted."""
    count = 0
    for chunk in chunks:
        chunk.requires_grad_(False)
        layers = chunk.decoder.layers
        for name, module in list(chunk.named_modules()):
            if ".experts." in name and targets(name, spec):
                raise ValueError(f"LoRA on a mixture of experts' expert layers ({name}) is not supported yet with "
                                 "strategy=megatron: use model.lora.exclude_modules or FSDP2 with model.lora_rank")
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and targets(name, spec):
                # seeded by the layer's global name: every layout (TP, PP stage) draws the same A
                full = _LAYER.sub(lambda m: f"decoder.layers.{layers[int(m.group(1))].layer_number - 1}.", name)
                module.adapter = Adapter(module, spec.rank, spec.alpha, spec.init_a, (seed + zlib.crc32(full.encode())) % 2**63)
                _wrap_forward(module)
                count += 1
    if not count:
        raise ValueError(f"model.lora.target_modules={spec.target_modules} / exclude_modules={spec.exclude_modules} adapt no layer "
                         f"of the model; megatron-core's dense linears are {', '.join(DENSE_LINEARS)}")
    return count


def adapters(chunks: list[torch.nn.Module]) -> list[Adapter]:
    return [m for chunk in chunks for m in chunk.modules() if isinstance(m, Adapter)]


@contextlib.contextmanager
def disabled(chunks: list[torch.nn.Module]):
    """The base model: every adapter off (the reference policy of a LoRA run)."""
    found = adapters(chunks)
    for adapter in found:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in found:
            adapter.enabled = True
