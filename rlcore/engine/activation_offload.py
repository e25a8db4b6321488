"""Checkpointed activations kept in host memory (`actor_rollout_ref.model.enable_activation_offload`).

With gradient checkpointing each decoder block keeps only its input for backward, and that input is what grows with
the layers: layers x tokens x hidden. Here each block's input is copied to pinned host memory as the block runs
forward, the device copy is freed once the next block has consumed it, and backward brings it back just before the
block is recomputed. The device then holds one block's input at a time instead of all of them; the copies travel
over PCIe in both directions (the gradient of the input too), on the compute stream, so ordering needs no events.

On a CPU device, host and device are one memory: nothing is copied (the key has no effect there).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch


def offload_checkpointed_inputs(blocks: torch.nn.ModuleList) -> None:
    """Wraps each block's checkpoint function (set by HF's activation_checkpointing_enable) so that the input it
    keeps for backward is a host copy."""
    for block in blocks:
        checkpoint = getattr(block, "_gradient_checkpointing_func", None)
        if checkpoint is None:
            raise ValueError(f"{type(block).__name__} is not checkpointed: enable_activation_offload needs "
                             "model.enable_gradient_checkpointing=True")
        block._gradient_checkpointing_func = functools.partial(checkpoint_from_host, checkpoint)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in host memory: itself on a CPU device, else a pinned copy."""
    return tensor if tensor.device.type == "cpu" else copy_to_host(tensor, pin=True)


def copy_to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    """A host copy that autograd sees as a copy (its gradient goes back to the tensor's device). Pinned, the copy
    is asynchronous on the compute stream."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
    return host.copy_(tensor, non_blocking=pin)


def checkpoint_from_host(checkpoint: Callable, forward: Callable, hidden: torch.Tensor, *args):
    """`checkpoint(forward, hidden, *args)` whose saved input is `hidden`'s host copy: the recompute in backward
    moves it back to the device first."""
    device = hidden.device
    return checkpoint(lambda host, *rest: forward(host.to(device, non_blocking=True), *rest), to_host(hidden), *args)
