"""The seam between backend-neutral workers and a training backend (FSDP2 today, Megatron next)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from rlcore.protocol import DataProto

# An engine hands these functions the model's outputs at the state BEFORE each response token (the next-token
# shift is done): `[batch, response_len, vocab]` logits of a causal LM, `[batch, response_len, 1]` of a value model.
# loss_fn(outputs, micro_batch) -> (scalar loss to backprop, metrics of this micro-batch)
LossFn = Callable[[torch.Tensor, DataProto], tuple[torch.Tensor, dict[str, float]]]
# fn(outputs, micro_batch) -> dict of per-sample tensors [micro_batch, ...]
ForwardFn = Callable[[torch.Tensor, DataProto], dict[str, torch.Tensor]]


@dataclass
class EngineSpec:
    """What a worker asks of an engine; built from the role's config section."""

    model_path: str
    kind: str = "causal_lm"               # causal_lm: logits [b, s, vocab]; value: a scalar head, outputs [b, s, 1]
    override_config: dict[str, Any] = field(default_factory=dict)
    param_dtype: str = "float32"          # compute dtype under mixed precision (fsdp_config.dtype)
    trainable: bool = True                # False for the reference policy: no optimizer, no grads
    gradient_checkpointing: bool = False
    param_offload: bool = False           # move params off the device between phases (worker calls offload())
    optimizer_offload: bool = False       # move optimizer state off the device between phases
    offload_policy: bool = False          # FSDP2-native CPUOffloadPolicy: params live on CPU, streamed per block
    reshard_after_forward: bool = True
    use_remove_padding: bool = False      # pack micro-batches (varlen attention) instead of computing on padding
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    warmup_steps: int = 0
    total_steps: int = 1
    lr_scheduler_type: str = "constant"   # constant | cosine
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    grad_clip: float = 1.0


class TrainEngine(ABC):
    """A sharded model (+ optimizer) on this rank's process group."""

    @abstractmethod
    def forward(self, micro_batches: list[DataProto], fn: ForwardFn) -> list[dict[str, torch.Tensor]]:
        """No-grad forward of each micro-batch; returns fn's outputs per micro-batch."""

    @abstractmethod
    def forward_backward(self, micro_batches: list[DataProto], loss_fn: LossFn) -> list[dict[str, float]]:
        """Accumulates gradients of loss_fn over the micro-batches; returns each micro-batch's metrics."""

    @abstractmethod
    def optimizer_step(self) -> dict[str, float]:
        """Clips, steps (skipping non-finite gradients), advances the lr schedule; returns grad_norm, lr."""

    @abstractmethod
    def rollout_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights under HF names, one tensor at a time. Collective: every rank iterates."""

    @abstractmethod
    def offload(self, params: bool = True, optimizer: bool = True) -> None: ...

    @abstractmethod
    def onload(self, params: bool = True, optimizer: bool = True) -> None: ...

    @abstractmethod
    def save(self, path: str, hf_dir: str | None = None) -> None:
        """Sharded model + optimizer + scheduler state into `path`; HF safetensors into `hf_dir` (rank 0)."""

    @abstractmethod
    def load(self, path: str) -> None: ...


def build_engine(strategy: str, spec: EngineSpec, device: torch.device) -> TrainEngine:
    if strategy in ("fsdp", "fsdp2"):
        from rlcore.engine.fsdp2 import FSDP2Engine

        return FSDP2Engine(spec, device)
    raise ValueError(f"actor_rollout_ref.actor.strategy={strategy!r} is not supported yet by rlcore; use fsdp2")
