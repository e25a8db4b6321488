"""Host memory that offloaded training state goes to, allocated once per tensor and reused at every offload."""

from __future__ import annotations

from typing import Hashable

import torch
from torch.distributed.tensor import DTensor


class HostBuffers:
    """Host copies of device tensors, keyed by the caller (one key per tensor it offloads).

    On an accelerator each key's buffer is allocated once, pinned (so the copy is an asynchronous DMA and the
    allocator is not asked for gigabytes of fresh host memory every phase) and refilled at each offload. On a CPU
    engine the device is the host: a kept copy would double the state's memory, so each offload makes a fresh copy
    that the onload lets go (`keep=False`)."""

    def __init__(self, device: torch.device, keep: bool | None = None) -> None:
        self.keep = device.type != "cpu" if keep is None else keep
        self.pin = device.type == "cuda"
        self.buffers: dict[Hashable, torch.Tensor] = {}

    def to_host(self, key: Hashable, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor holding `tensor`'s values (the same buffer for the same key while its shape holds). A DTensor
        (FSDP2's sharded optimizer state) keeps its layout: its local shard goes into the buffer and comes back wrapped
        the same way, so the onload's `.to(device)` restores it as it was."""
        if not self.keep:
            return tensor.detach().to("cpu", copy=True)
        if isinstance(tensor, DTensor):
            local = self.to_host(key, tensor.to_local())
            return DTensor.from_local(local, tensor.device_mesh, tensor.placements, run_check=False, shape=tensor.shape, stride=tensor.stride())
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self.buffers[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin)
        buffer.copy_(tensor.detach(), non_blocking=self.pin)
        return buffer

    def sync(self) -> None:
        """Waits for the asynchronous copies (before the device memory they read is handed back)."""
        if self.pin:
            torch.cuda.current_stream().synchronize()
