"""Parameters, gradient buffers and optimizer state of a Megatron engine off the device between phases.

megatron-core keeps parameters and gradients as views into flat DDP buffers (and the distributed optimizer's
shards as views into those), so tensors cannot simply be replaced by CPU copies: each storage owner is copied to
the CPU and its storage shrunk to nothing, then grown back and refilled, so every view stays valid.
"""

from __future__ import annotations

import torch

from rlcore.engine.host_buffers import HostBuffers


def grad_buffers(chunk) -> list:
    """megatron DDP's flat parameter + gradient buffers of a chunk: the dense ones and, with expert parallelism, the
    routed experts' (reduced over the expert-data-parallel group). An unwrapped (frozen) model has none: only
    nn.Module's `buffers()` method answers to that name there."""
    if not isinstance(getattr(chunk, "buffers", None), list):
        return []
    return chunk.buffers + getattr(chunk, "expert_parallel_buffers", [])


def _owners(engine, params: bool, grads: bool, optimizer: bool) -> list[torch.Tensor]:
    """Tensors that own the storage of the chosen state, each storage once."""
    out: list[torch.Tensor] = []
    if params or grads:
        for chunk in engine.model:
            buffers = grad_buffers(chunk)
            if params:
                in_buffers = {id(p) for buf in buffers for p in buf.params} if any(buf.param_data is not None for buf in buffers) else set()
                out.extend(buf.param_data for buf in buffers if buf.param_data is not None)
                out.extend(p.data for p in chunk.parameters() if id(p) not in in_buffers)
            if grads:
                out.extend(buf.grad_data for buf in buffers)
    if optimizer and engine.optimizer is not None:
        # The optimizer's own parameters are state of its own only when they are copies (fp32 main params of a
        # half-precision model). An fp32 model's optimizer steps the model's parameters themselves, or views of
        # their buffer: those are parameters, counted and moved as such. Counted as optimizer state too, they
        # doubled the ledger's optimizer bytes and kept the parameters on the device whenever they offloaded
        # without the optimizer (measured on an H200: 1.3 GiB of a 0.5B model's parameters left behind).
        model = {_storage_key(t) for t in _owners(engine, params=True, grads=False, optimizer=False)}
        for opt in engine._inner_optimizers():
            for state in opt.state.values():
                out.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
            out.extend(p.data for group in opt.param_groups for p in group["params"] if _storage_key(p.data) not in model)
    seen, owners = set(), []
    for t in out:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            owners.append(t)
    return owners


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # the storage object itself: stable while its memory comes and goes


def state_bytes(engine, kind: str) -> int:
    """Bytes of one kind of state ("params", "grads", "optimizer") on this rank, resident or offloaded (an offloaded
    storage is counted at the size it is grown back to)."""
    stash = engine.__dict__.get("_offloaded", {})
    owners = _owners(engine, kind == "params", kind == "grads", kind == "optimizer")
    return sum(stash[_storage_key(t)][1] if _storage_key(t) in stash else t.untyped_storage().nbytes() for t in owners)


def move_state(engine, to_host: bool, params: bool, grads: bool, optimizer: bool) -> None:
    """To host memory (`to_host`) or back to the engine's device; a CPU engine really frees and refills the memory
    too. A storage shared with state that stays (e.g. main params that are views of the parameter buffer) stays
    too; views into larger storages move with their owner."""
    stash = engine.__dict__.setdefault("_offloaded", {})  # storage key -> (owner, bytes, host copy)
    host = engine.__dict__.setdefault("_host_buffers", HostBuffers(engine.device))  # reused, pinned on CUDA
    chosen = _owners(engine, params, grads, optimizer)
    if to_host:
        keep = {_storage_key(t) for t in _owners(engine, not params, not grads, not optimizer)}
        moved = []
        for t in chosen:
            key, storage = _storage_key(t), t.untyped_storage()
            if key in keep or key in stash or t.storage_offset() != 0 or t.numel() * t.element_size() != storage.nbytes():
                continue
            stash[key] = (t, storage.nbytes(), host.to_host(key, t))
            moved.append(storage)
        host.sync()  # the copies have read the device memory before it is handed back
        for storage in moved:
            storage.resize_(0)
    else:
        for t in chosen:
            key = _storage_key(t)
            if key in stash:
                owner, nbytes, cpu = stash.pop(key)
                owner.untyped_storage().resize_(nbytes)
                owner.copy_(cpu)
    if engine.device.type == "cuda":
        torch.cuda.empty_cache()
