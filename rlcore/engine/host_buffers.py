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
        self.layouts: dict[Hashable, tuple] = {}  # key -> (mesh, placements, shape, stride) of a DTensor's host shard

    def to_host(self, key: Hashable, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor holding `tensor`'s values (the same buffer for the same key while its shape holds). Of a
        DTensor (FSDP2's sharded optimizer state) the buffer holds the local shard, and `to_device` wraps it again:
        a DTensor cannot wrap a host tensor on a CUDA mesh (`from_local` copies it back to the device, which left an
        "offloaded" AdamW on an H200's memory) and copying a DTensor into a plain buffer raises."""
        if not self.keep:
            return tensor.detach().to("cpu", copy=True)
        if isinstance(tensor, DTensor):
            self.layouts[key] = (tensor.device_mesh, tensor.placements, tensor.shape, tensor.stride())
            tensor = tensor.to_local()
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self.buffers[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin)
        buffer.copy_(tensor.detach(), non_blocking=self.pin)
        return buffer

    def to_device(self, key: Hashable, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """`to_host`'s copy back on `device` (asynchronous from a pinned buffer), a DTensor again if it was one."""
        local = tensor.to(device, non_blocking=True)
        if key not in self.layouts or isinstance(tensor, DTensor):
            return local
        mesh, placements, shape, stride = self.layouts[key]
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)

    def sync(self) -> None:
        """Waits for the asynchronous copies (before the device memory they read is handed back)."""
        if self.pin:
            torch.cuda.current_stream().synchronize()
