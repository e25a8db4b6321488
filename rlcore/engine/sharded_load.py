"""Loading a HF checkpoint into an FSDP2 model without any rank holding the whole model.

The model is built with its parameters on the meta device (no memory; buffers such as rotary tables are computed for
real, they are small), sharded with `fully_shard` (which shards dim 0), given empty local shards, and each rank then
reads from the safetensors files only the rows its shard holds, with plain reads straight into the shard (through
one slice-sized buffer when the dtype or device differs). Not through a memory map: the mapped file pages a rank
touched would count in its resident memory until the file is closed, doubling the peak. A rank's host memory grows
by its shard plus one slice, not by the model: at 32B in fp32, 16 GB per rank on 8 ranks instead of 128 GB.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlcore.models.experts import expert_pieces, is_fused

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def safetensors_files(model_dir: str) -> dict[str, str] | None:
    """Tensor name -> safetensors file of a HF checkpoint directory; None when it is not in safetensors."""
    index = os.path.join(model_dir, INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            return {name: os.path.join(model_dir, file) for name, file in json.load(f)["weight_map"].items()}
    single = os.path.join(model_dir, SINGLE)
    if os.path.isfile(single):
        with open(single, "rb") as f:
            return dict.fromkeys(read_header(f)[1], single)
    return None


def read_header(f: BinaryIO) -> tuple[int, dict[str, dict]]:
    """(where the data starts, {tensor name: {"dtype", "shape", "data_offsets"}}) of a safetensors file."""
    size = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def read_rows(f: BinaryIO, data_start: int, meta: dict, start: int, out: torch.Tensor) -> None:
    """Rows `[start, start + len(out))` of one tensor (its dim 0) into `out`: read in place when `out` is a contiguous
    CPU tensor of the file's dtype, else through one buffer of the rows' bytes."""
    dtype = DTYPES[meta["dtype"]]
    row_bytes = math.prod(meta["shape"][1:]) * dtype.itemsize
    f.seek(data_start + meta["data_offsets"][0] + start * row_bytes)
    nbytes = out.numel() * dtype.itemsize
    if out.dtype == dtype and out.device.type == "cpu" and out.is_contiguous():
        target = out.reshape(-1).view(torch.uint8)
    else:
        target = torch.empty(nbytes, dtype=torch.uint8)
    # A buffer over the tensor's memory, not `target.numpy()`: exporting a storage to numpy marks it non-resizable
    # for good, and offloading (rlcore.engine.megatron.offload) frees a parameter by resizing its storage to 0.
    if f.readinto(memoryview((ctypes.c_char * nbytes).from_address(target.data_ptr())).cast("B")) != nbytes:
        raise EOFError(f"{f.name}: the file ends inside a tensor (truncated checkpoint?)")
    if target.data_ptr() != out.data_ptr():
        out.copy_(target.view(dtype).reshape(out.shape))


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within it, every parameter a module registers lands on the meta device as it is created (before the
    module's own initialisation touches it); buffers are created for real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def materialize(model: nn.Module, device: torch.device) -> None:
    """Gives a meta-built (sharded) model empty storage on `device`, keeping the buffers it computed at build."""
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def value_head_init(model: nn.Module, files: dict[str, str]) -> dict[str, torch.Tensor] | None:
    """A value model built on meta over a causal LM's checkpoint: the scalar head the checkpoint lacks, drawn as HF
    initialises it (normal, std `initializer_range`, the process's RNG), whole (it is one row); {} when the
    checkpoint has it (a reward model's). None when no parameter's name is in the checkpoint (another naming: the
    caller loads whole, through HF's mapping); other missing tensors are left for load_shards to name."""
    names = [name for name, _ in model.named_parameters()]
    if not any(name in files for name in names):
        return None
    if "score.weight" in files or "score.weight" not in names:
        return {}
    shape = model.get_parameter("score.weight").shape
    return {"score.weight": torch.empty(shape).normal_(0.0, model.config.initializer_range)}


def _local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's rows of a parameter, the index of its first row): fully_shard splits dim 0 only."""
    if not isinstance(param, DTensor):
        return param.data, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    assert tuple(shape[1:]) == tuple(param.shape[1:]) and not any(offset[1:]), (shape, offset)  # a run of whole rows
    return param.to_local(), (offset[0] if offset else 0)


def _reads(param: torch.Tensor, checkpoint_name: str, files: dict[str, str]) -> list | None:
    """(checkpoint tensor, its first row, its shape, where its rows go) for each piece of this rank's shard of
    `param`; None when the checkpoint lacks it. A fused expert parameter absent under its own name is read expert by
    expert from the per-expert tensors checkpoints hold (rlcore.models.experts): its rows are experts, so a shard
    is whole ones."""
    local, first = _local_rows(param)
    if checkpoint_name in files:
        return [(checkpoint_name, first, list(param.shape), local)] if local.numel() else []
    if not is_fused(checkpoint_name):
        return None
    pieces = [expert_pieces(checkpoint_name, expert, param.shape[1]) for expert in range(param.shape[0])]
    if any(piece not in files for expert in pieces for piece, *_ in expert):
        return None
    return [(piece, 0, [rows, *param.shape[2:]], local[row, piece_row : piece_row + rows])
            for row in range(local.shape[0]) for piece, piece_row, rows in pieces[first + row]]


def renamed_checkpoint(model: nn.Module, files: dict[str, str], initial: dict | None = None) -> bool:
    """Whether the checkpoint names its tensors otherwise than the model (and its per-expert pieces) does, so that some
    parameters find no tensor: a family whose checkpoint names transformers converts on load (Mixtral's experts). A
    checkpoint that merely lacks a tensor is not renamed: load_shards names what is missing."""
    known = set(model.state_dict())
    for name, param in model.named_parameters():
        if is_fused(name):
            known |= {piece for expert in range(param.shape[0]) for piece, *_ in expert_pieces(name, expert, param.shape[1])}
    lacking = any(name not in (initial or {}) and _reads(param, name, files) is None for name, param in model.named_parameters())
    return lacking and any(name not in known for name in files)


@torch.no_grad()
def load_shards(model: nn.Module, files: dict[str, str], initial: dict[str, torch.Tensor] | None = None,
                rename: Callable[[str], str] = lambda name: name) -> None:
    """Fills each parameter's local shard from the checkpoint rows it covers, or from `initial` (whole tensors of
    parameters the checkpoint does not have). Any other parameter the checkpoint lacks is an error naming it (a
    tied head is one parameter with the embedding, listed once). `rename`: a parameter's name in the checkpoint
    (a peft model's base weights are the HF checkpoint's under other names)."""
    initial = initial or {}
    for name, tensor in initial.items():
        local, first = _local_rows(model.get_parameter(name))
        local.copy_(tensor[first : first + local.shape[0]] if local.dim() else tensor)
    by_file: dict[str, list] = {}
    missing = []
    for name, param in model.named_parameters():
        if name in initial:
            continue
        reads = _reads(param, rename(name), files)
        if reads is None:
            missing.append(rename(name))
        for read in reads or []:
            by_file.setdefault(files[read[0]], []).append(read)
    if missing:
        raise KeyError(f"the checkpoint has no tensor for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for file, reads in by_file.items():
        with open(file, "rb") as f:
            data_start, header = read_header(f)
            for name, first_row, shape, out in reads:
                if header[name]["shape"] != shape:
                    raise ValueError(f"{file}: {name} has shape {header[name]['shape']}, the model expects {shape}")
                read_rows(f, data_start, header[name], first_row, out)
