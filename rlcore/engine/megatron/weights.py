"""HF <-> megatron-core weights for the families megatron builds (rlcore.families: Family.megatron): load a
checkpoint directory into this rank's TP/PP/EP pieces (reading only its slices), and stream full HF-named tensors back out (TP shards gathered, PP
stages broadcast, a layer's routed experts gathered over expert-TP x EP into HF's fused tensors: moe.py).

Layouts (megatron-core local spec, TP rank r of tp, ng query groups of qpg query heads each, head dim d):
- linear_qkv.weight `[(ng/tp) * (qpg + 2) * d, hidden]`: per local group, its qpg query heads, then its key head,
  then its value head (GQA interleaving); the bias likewise.
- linear_fc1.weight `[2 * ffn/tp, hidden]`: this rank's rows of gate_proj, then its rows of up_proj.
- word embeddings / output layer: rows of the vocabulary padded to a multiple of tp (padding rows are zero).
- linear_proj / linear_fc2: split on the input dimension; norms: whole on every rank.
- multi-head latent attention (DeepSeek-V3): each of its projections split on the output dimension.
- MoE layers (moe.py): router whole on every rank; shared expert as a dense MLP; each local routed expert as a
  dense MLP split over the expert-TP group instead of the TP group.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from safetensors import safe_open

from rlcore.engine.megatron import moe
from rlcore.engine.sharded_load import read_header, read_rows
from rlcore.utils.dist import all_gather_flat, broadcast

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_COMMON = {  # megatron-core name inside a layer -> (kind, HF names inside model.layers.{i})
    "input_layernorm.weight": ("copy", ("input_layernorm.weight",)),
    "self_attention.linear_proj.weight": ("split1", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("copy", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("split1", ("mlp.down_proj.weight",)),
}
_ATTENTION = {
    "self_attention.linear_qkv.weight": ("qkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")),
    "self_attention.linear_qkv.bias": ("qkv", ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")),
    "self_attention.q_layernorm.weight": ("copy", ("self_attn.q_norm.weight",)),  # Qwen3
    "self_attention.k_layernorm.weight": ("copy", ("self_attn.k_norm.weight",)),
}
# DeepSeek's multi-head latent attention: every projection column-parallel (the down projections too: megatron-core
# gathers their outputs), the latents' norms whole.
_LATENT_ATTENTION = {
    "self_attention.linear_q_proj.weight": ("split0", ("self_attn.q_proj.weight",)),  # without a query latent
    "self_attention.linear_q_down_proj.weight": ("split0", ("self_attn.q_a_proj.weight",)),
    "self_attention.q_layernorm.weight": ("copy", ("self_attn.q_a_layernorm.weight",)),
    "self_attention.linear_q_up_proj.weight": ("split0", ("self_attn.q_b_proj.weight",)),
    "self_attention.linear_kv_down_proj.weight": ("split0", ("self_attn.kv_a_proj_with_mqa.weight",)),
    "self_attention.kv_layernorm.weight": ("copy", ("self_attn.kv_a_layernorm.weight",)),
    "self_attention.linear_kv_up_proj.weight": ("split0", ("self_attn.kv_b_proj.weight",)),
}


def layer_map(megatron) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The HF names of a layer's parameters for a family's megatron build (rlcore.families: Family.megatron)."""
    return {**_COMMON, **(_LATENT_ATTENTION if megatron.latent_attention else _ATTENTION), **moe.layer_map(megatron.shared_experts)}


def tensor(chunk: torch.nn.Module, name: str) -> torch.Tensor:
    """A parameter, or a buffer the weights carry (the router's expert bias), by name."""
    try:
        return chunk.get_parameter(name)
    except AttributeError:
        return chunk.get_buffer(name)


@dataclass(frozen=True)
class Entry:
    """One megatron-core parameter of one model chunk and the HF tensors it holds (pieces of)."""

    chunk: int            # index of the model chunk (virtual stage) on its pipeline rank
    name: str             # parameter name inside the chunk
    kind: str             # copy | split0 | split1 | vocab | qkv | gate_up | expert_fc1 | expert_fc2
    hf_names: tuple[str, ...]
    export: bool = True   # False: a copy of another entry's tensor (the last stage's tied output layer)
    expert: int | None = None  # a routed expert's global index (its HF name is the layer's fused tensor)


def entries(chunks: list[torch.nn.Module], kind: str, tied: bool, hf_layer: dict) -> list[Entry]:
    """The HF mapping of every parameter of this rank's chunks (and the router biases), in the chunks' parameter
    order; `hf_layer`: layer_map(family.megatron)."""
    out = []
    for c, chunk in enumerate(chunks):
        layers = chunk.decoder.layers
        biases = [name for name, _ in chunk.named_buffers() if name.endswith(".router.expert_bias")]
        for name in [name for name, _ in chunk.named_parameters()] + biases:
            if ".adapter." in name:  # LoRA's A and B: exported merged into their layer's weight (_local)
                continue
            m = _LAYER.fullmatch(name)
            if m:
                layer = layers[int(m.group(1))].layer_number - 1  # global index (megatron counts from 1)
                expert = moe.expert_param(m.group(2))
                if expert is not None:
                    local, fc = expert
                    first = layers[int(m.group(1))].mlp.local_expert_indices[0]
                    out.append(Entry(c, name, f"expert_fc{fc}", (f"model.layers.{layer}.{moe.FUSED[fc]}",), expert=first + local))
                    continue
                how, hf = hf_layer[m.group(2)]
                out.append(Entry(c, name, how, tuple(f"model.layers.{layer}.{n}" for n in hf)))
            elif name == "embedding.word_embeddings.weight":
                out.append(Entry(c, name, "vocab", ("model.embed_tokens.weight",)))
            elif name == "decoder.final_layernorm.weight":
                out.append(Entry(c, name, "copy", ("model.norm.weight",)))
            elif name == "output_layer.weight" and kind == "value":
                out.append(Entry(c, name, "copy", ("score.weight",)))
            elif name == "output_layer.weight":
                # A tied model keeps a copy of the embedding on the last stage (pipeline parallel only).
                out.append(Entry(c, name, "vocab", ("model.embed_tokens.weight",) if tied else ("lm_head.weight",), export=not tied))
            else:
                raise ValueError(f"no HF name for megatron-core parameter {name!r}")
    return out


def adapter_entries(chunks: list[torch.nn.Module], hf_layer: dict) -> list[Entry]:
    """LoRA's factors (rlcore.engine.megatron.lora) as entries exported under peft's names over HF modules: a
    column-parallel linear's B is split like its weight (q/k/v or gate/up rows) and its A, whole, is every part's
    A (a fused linear's parts share it exactly); a row-parallel linear's A is split like its weight, its B whole."""
    out = []
    for c, chunk in enumerate(chunks):
        layers = chunk.decoder.layers
        for name, _ in chunk.named_parameters():
            m = _LAYER.fullmatch(name)
            if ".adapter.lora_" not in name or not m:
                continue
            linear, factor = m.group(2).split(".adapter.")
            how, hf = hf_layer[f"{linear}.weight"]
            layer = layers[int(m.group(1))].layer_number - 1
            modules = [f"model.layers.{layer}.{n.removesuffix('.weight')}" for n in hf]
            row = how == "split1"
            kind = ("split1" if row else "copy_all") if factor == "lora_A" else ("copy" if row else how)
            out.append(Entry(c, name, kind, tuple(f"{mod}.{factor}.weight" for mod in modules)))
    return out


# ---------------------------------------------------------------------------------------------------- reading HF
class HFCheckpoint:
    """The safetensors of an HF directory (one file or an index of shards), read tensor slice by tensor slice."""

    def __init__(self, path: str) -> None:
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                self.file_of = {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
        elif os.path.exists(os.path.join(path, "model.safetensors")):
            single = os.path.join(path, "model.safetensors")
            with safe_open(single, "pt") as f:
                self.file_of = {k: single for k in f.keys()}
        else:
            raise FileNotFoundError(f"{path} has no model.safetensors(.index.json): the megatron engine reads safetensors "
                                    "checkpoints; re-save the model with save_pretrained(..., safe_serialization=True)")

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def shape(self, name: str) -> list[int]:
        with safe_open(self.file_of[name], "pt") as f:
            return f.get_slice(name).get_shape()

    def slice(self, name: str, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None,
              expert: int | None = None) -> torch.Tensor:
        """Rows / columns of a 2-D tensor, or of matrix `expert` of a 3-D one (HF's fused expert weights)."""
        # The file is mapped for this one read and unmapped after: the mapped pages a rank touched count in its
        # resident memory until then, and a TP rank's column slice touches every row of the tensor. Kept open for
        # the whole load, the whole checkpoint ended up counted on every rank (1.35x the fp32 model at TP2).
        with safe_open(self.file_of[name], "pt") as f:
            t = f.get_slice(name)
            # A slice is read into its own buffer, not a view of the mapping: it outlives the file.
            if rows is None and cols is None and expert is None:
                return t[:]
            r = slice(*rows) if rows else slice(None)
            if expert is not None:
                return t[expert : expert + 1, r, slice(*cols) if cols else slice(None)][0]
            return t[r, slice(*cols)] if cols else t[r]

    def read_into(self, name: str, first_row: int, out: torch.Tensor) -> None:
        """Rows `[first_row, first_row + len(out))` of `name` straight into `out`: plain reads, no mapping, and no
        buffer of their own when the dtype matches (rlcore.engine.sharded_load.read_rows). The vocabulary's pieces,
        a TP rank's largest, are read this way: as a slice of their own they were the load's largest transient."""
        with open(self.file_of[name], "rb") as f:
            start, header = read_header(f)
            shape = header[name]["shape"]
            if list(shape[1:]) != list(out.shape[1:]) or first_row + len(out) > (shape[0] if shape else 1):
                raise ValueError(f"{name} has shape {tuple(shape)} in {self.file_of[name]}: rows {first_row}..{first_row + len(out)} "
                                 f"of {tuple(out.shape[1:])} do not fit; the checkpoint does not match its config.json")
            read_rows(f, start, header[name], first_row, out)


def _qkv_geometry(config) -> tuple[int, int, int, int]:
    """(query groups per TP rank, query heads per group, head dim, tp)."""
    tp = config.tensor_model_parallel_size
    groups = config.num_query_groups
    return groups // tp, config.num_attention_heads // groups, config.kv_channels, tp


def local_piece(ckpt: HFCheckpoint, entry: Entry, config, vocab_size: int, padded_vocab: int, shape: torch.Size) -> torch.Tensor:
    """This TP rank's piece of an entry, read from the checkpoint (a vocabulary piece without its padding rows:
    `shape[0]` or fewer)."""
    tp, r = config.tensor_model_parallel_size, mpu.get_tensor_model_parallel_rank()
    if entry.kind == "copy":
        return ckpt.slice(entry.hf_names[0])
    if entry.kind == "split0":
        n = shape[0]
        return ckpt.slice(entry.hf_names[0], rows=(r * n, (r + 1) * n))
    if entry.kind == "split1":
        n = shape[1]
        return ckpt.slice(entry.hf_names[0], cols=(r * n, (r + 1) * n))
    if entry.kind == "vocab":
        rows = padded_vocab // tp
        start, stop = min(r * rows, vocab_size), min((r + 1) * rows, vocab_size)
        return ckpt.slice(entry.hf_names[0], rows=(start, stop))
    if entry.kind == "gate_up":
        n = shape[0] // 2
        return torch.cat([ckpt.slice(h, rows=(r * n, (r + 1) * n)) for h in entry.hf_names])
    if entry.kind in moe.EXPERT_KINDS:  # split over the expert-TP group, not the TP group
        return moe.read_expert(ckpt, entry.hf_names[0], entry.expert, entry.kind, shape, mpu.get_expert_tensor_parallel_rank())
    if entry.kind == "qkv":
        groups, per_group, d, _ = _qkv_geometry(config)
        g0 = r * groups
        q = ckpt.slice(entry.hf_names[0], rows=(g0 * per_group * d, (g0 + groups) * per_group * d))
        k, v = (ckpt.slice(h, rows=(g0 * d, (g0 + groups) * d)) for h in entry.hf_names[1:])
        tail = q.shape[1:]
        q = q.reshape(groups, per_group * d, *tail)
        k, v = (t.reshape(groups, d, *tail) for t in (k, v))
        return torch.cat([q, k, v], dim=1).reshape(-1, *tail)
    raise AssertionError(entry.kind)


@torch.no_grad()
def load_hf(chunks: list[torch.nn.Module], model_path: str, config, vocab_size: int, padded_vocab: int, kind: str, tied: bool,
            value_head_std: float, hf_layer: dict) -> None:
    """Fills every parameter of this rank's chunks from the HF checkpoint at `model_path`. A value model loaded
    from a causal LM (no `score.weight`) gets a fresh N(0, value_head_std) head, the same on every rank."""
    ckpt = HFCheckpoint(model_path)
    for entry in entries(chunks, kind, tied, hf_layer):
        param = tensor(chunks[entry.chunk], entry.name)
        if entry.hf_names == ("score.weight",) and "score.weight" not in ckpt:
            generator = torch.Generator().manual_seed(0)
            param.copy_(torch.randn(param.shape, generator=generator) * value_head_std)
            continue
        if entry.kind in ("vocab", "copy") and param.is_contiguous():  # whole rows: read in place
            rows = padded_vocab // config.tensor_model_parallel_size
            first = min(mpu.get_tensor_model_parallel_rank() * rows, vocab_size) if entry.kind == "vocab" else 0
            count = min(first + rows, vocab_size) - first if entry.kind == "vocab" else param.shape[0]
            ckpt.read_into(entry.hf_names[0], first, param[:count])
            param[count:].zero_()  # the vocabulary's padding rows
            continue
        piece = local_piece(ckpt, entry, config, vocab_size, padded_vocab, param.shape)
        # Copied into the parameter as read (no padded copy: one piece is the load's whole transient).
        padding = param.shape[0] - piece.shape[0] if entry.kind == "vocab" else 0
        if piece.shape[1:] != param.shape[1:] or not 0 <= padding <= (param.shape[0] if entry.kind == "vocab" else 0):
            raise ValueError(f"{entry.hf_names} in {model_path} give {tuple(piece.shape)} for {entry.name} {tuple(param.shape)}: "
                             "the checkpoint does not match its config.json")
        param[: piece.shape[0]].copy_(piece)
        param[piece.shape[0]:].zero_()  # the vocabulary's padding rows


# ---------------------------------------------------------------------------------------------------- exporting HF
def full_tensors(entry, shards: list[torch.Tensor], config, vocab_size: int) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors of an entry from all its gather group's pieces (TP-rank order; a routed-expert stack's from
    every expert-TP x EP rank, `shards[ep_rank * etp + etp_rank]`)."""
    if entry.kind in moe.EXPERT_KINDS:
        return [(entry.hf_names[0], moe.fused_experts(entry.kind, shards, config.expert_model_parallel_size,
                                                      config.expert_tensor_parallel_size))]
    if entry.kind == "copy":
        return [(entry.hf_names[0], shards[0])]
    if entry.kind == "copy_all":  # one tensor under several names (a fused linear's shared LoRA A)
        return [(name, shards[0]) for name in entry.hf_names]
    if entry.kind == "split0":
        return [(entry.hf_names[0], torch.cat(shards))]
    if entry.kind == "split1":
        return [(entry.hf_names[0], torch.cat(shards, dim=1))]
    if entry.kind == "vocab":
        return [(entry.hf_names[0], torch.cat(shards)[:vocab_size])]
    if entry.kind == "gate_up":
        halves = [s.chunk(2) for s in shards]
        return [(entry.hf_names[i], torch.cat([h[i] for h in halves])) for i in range(2)]
    groups, per_group, d, _ = _qkv_geometry(config)
    tail = shards[0].shape[1:]
    grouped = torch.cat([s.reshape(groups, per_group + 2, d, *tail) for s in shards])  # [ng, qpg + 2, d, ...]
    q = grouped[:, :per_group].reshape(-1, *tail)
    k, v = grouped[:, per_group].reshape(-1, *tail), grouped[:, per_group + 1].reshape(-1, *tail)
    return [(entry.hf_names[0], q), (entry.hf_names[1], k), (entry.hf_names[2], v)]


def _is_expert(entry) -> bool:
    return entry.kind in moe.EXPERT_KINDS


def _expert_ranks(config) -> int:
    """The size of the expert-TP x EP group (1 for a dense model)."""
    return config.expert_tensor_parallel_size * config.expert_model_parallel_size if config.num_moe_experts else 1


def _gather_size(entry, tp: int, expert_ranks: int) -> int:
    """Ranks whose pieces make up the entry: its TP group, or a routed-expert stack's expert-TP x EP group."""
    return expert_ranks if _is_expert(entry) else tp


def _local(chunks, entry) -> torch.Tensor:
    """This rank's piece of an exported entry (a routed-expert stack: its local experts' pieces, stacked)."""
    if isinstance(entry, moe.ExpertStack):
        return moe.local_stack(chunks[entry.chunk], entry)
    weight = tensor(chunks[entry.chunk], entry.name).detach()
    owner, _, leaf = entry.name.rpartition(".")
    adapter = getattr(chunks[entry.chunk].get_submodule(owner), "adapter", None) if leaf == "weight" else None
    # LoRA: this rank's shard of W + s B A, unless the adapters are off (the base alone: their unmerged sync)
    return adapter.merged(weight).detach() if adapter is not None and adapter.enabled else weight


@dataclass(frozen=True)
class _Manifest:
    """One exported entry as every rank of the pipeline group knows it."""

    stage: int            # pipeline rank that owns it
    entry: Entry | moe.ExpertStack
    shape: tuple[int, ...]  # this rank's piece (equal on all ranks of its gather group)
    dtype: torch.dtype


def export_manifest(chunks: list[torch.nn.Module], kind: str, tied: bool, hf_layer: dict, adapters: bool = False) -> list[_Manifest]:
    """Every exported entry of every pipeline stage, in model order (stage by stage; with interleaving, by
    virtual stage): the same list on every rank of the pipeline group. A layer's routed experts are one entry per
    projection (moe.ExpertStack). `adapters`: LoRA's factors instead of the weights. Collective over the pipeline group."""
    mine = []
    for e in adapter_entries(chunks, hf_layer) if adapters else moe.stack_experts(entries(chunks, kind, tied, hf_layer)):
        if e.export:
            local = _local(chunks, e) if isinstance(e, moe.ExpertStack) else tensor(chunks[e.chunk], e.name)
            mine.append((e, tuple(local.shape), local.dtype))
    pp = mpu.get_pipeline_model_parallel_world_size()
    stages = [mine]
    if pp > 1:
        stages = [None] * pp
        dist.all_gather_object(stages, mine, group=mpu.get_pipeline_model_parallel_group())
    out = [_Manifest(s, e, shape, dtype) for s, items in enumerate(stages) for e, shape, dtype in items]
    # Interleaved stages own layer ranges in the order (virtual stage, pipeline rank): export in that order.
    return sorted(out, key=lambda m: (m.entry.chunk, m.stage))


def _buckets(manifest: list[_Manifest], bucket_bytes: int, tp: int = 1, expert_ranks: int = 1) -> Iterator[list[_Manifest]]:
    """Runs of consecutive entries owned by one stage and gathered over one group, each at most bucket_bytes once
    gathered (or one entry): the all-gather receives every rank's piece, so a bucket costs (group size) x its local
    pieces, not its local size."""
    bucket: list[_Manifest] = []
    size = 0
    for m in manifest:
        nbytes = torch.Size(m.shape).numel() * m.dtype.itemsize * _gather_size(m.entry, tp, expert_ranks)
        if bucket and (m.stage != bucket[0].stage or m.dtype != bucket[0].dtype or _is_expert(m.entry) != _is_expert(bucket[0].entry)
                       or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append(m)
        size += nbytes
    if bucket:
        yield bucket


def _expert_rank_order() -> list[int]:
    """For each (EP rank, expert-TP rank) in that order, the rank of the expert-TP x EP group holding it (the group
    asks each member once, rather than assuming megatron-core's rank order)."""
    group = mpu.get_expert_tensor_and_model_parallel_group()
    ep_rank, _, etp_rank, etp = moe.ep_layout()
    coords = [None] * dist.get_world_size(group)
    dist.all_gather_object(coords, (ep_rank, etp_rank), group=group)
    return [coords.index((j, t)) for j in range(len(coords) // etp) for t in range(etp)]


@torch.no_grad()
def export_hf(chunks: list[torch.nn.Module], manifest: list[_Manifest], config, vocab_size: int, device: torch.device,
              bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF-named tensors, one at a time, on every rank (collective over the TP, expert-TP x EP and PP groups of
    this rank).

    Per bucket: the owning stage's TP ranks (for routed experts: expert-TP x EP ranks, so each expert leaves its EP
    rank once) all-gather their pieces in one flat buffer (at most `bucket_bytes` gathered) and rebuild the HF
    tensors from it one at a time, each handed out before the next is built: the transient peak is the gathered
    bucket plus one rebuilt tensor. With pipeline parallelism the owner rebuilds the whole bucket and broadcasts
    it, flat, to the other stages (two buckets' worth).
    """
    pp = mpu.get_pipeline_model_parallel_world_size()
    my_stage = mpu.get_pipeline_model_parallel_rank()
    expert_order = _expert_rank_order() if any(_is_expert(m.entry) for m in manifest) else None
    for bucket in _buckets(manifest, bucket_bytes, config.tensor_model_parallel_size, _expert_ranks(config)):
        owner = bucket[0].stage
        if pp == 1:
            yield from _rebuilt(chunks, bucket, config, vocab_size, expert_order)
            continue
        tensors = list(_rebuilt(chunks, bucket, config, vocab_size, expert_order)) if owner == my_stage else []
        yield from _broadcast_from_stage(tensors, bucket, owner, config, vocab_size, device)


def _rebuilt(chunks, bucket: list[_Manifest], config, vocab_size: int, expert_order: list[int] | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The bucket's HF tensors, rebuilt lazily from one all-gather of its pieces over its group (collective on the
    first draw)."""
    experts = _is_expert(bucket[0].entry)
    size = _gather_size(bucket[0].entry, config.tensor_model_parallel_size, _expert_ranks(config))
    flat = torch.cat([_local(chunks, m.entry).reshape(-1) for m in bucket])
    if size > 1:
        group = mpu.get_expert_tensor_and_model_parallel_group() if experts else mpu.get_tensor_model_parallel_group()
        gathered = flat.new_empty(size * flat.numel())  # flat: gloo wants the output 1-D
        all_gather_flat(gathered, flat, group=group)
        del flat  # only the gathered bucket stays
        gathered = gathered.view(size, -1)
    else:
        gathered = flat[None]
    order = expert_order if experts and size > 1 else range(size)
    offset = 0
    for m in bucket:
        n = torch.Size(m.shape).numel()
        shards = [gathered[r, offset : offset + n].view(m.shape) for r in order]
        yield from full_tensors(m.entry, shards, config, vocab_size)
        offset += n


def _broadcast_from_stage(tensors, bucket: list[_Manifest], owner: int, config, vocab_size: int, device) -> list[tuple[str, torch.Tensor]]:
    """The owner stage's rebuilt tensors on every stage of this pipeline group, in one flat broadcast."""
    shapes = _full_shapes(bucket, config, vocab_size)
    numel = sum(torch.Size(s).numel() for _, s in shapes)
    if tensors:
        flat = torch.cat([t.reshape(-1) for _, t in tensors])
    else:
        flat = torch.empty(numel, dtype=bucket[0].dtype, device=device)
    src = mpu.get_pipeline_model_parallel_group()
    broadcast(flat, src=dist.get_global_rank(src, owner), group=src)
    out, offset = [], 0
    for name, shape in shapes:
        n = torch.Size(shape).numel()
        out.append((name, flat[offset : offset + n].view(shape)))
        offset += n
    return out


def _full_shapes(bucket: list[_Manifest], config, vocab_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """The HF names and full shapes a bucket rebuilds to (computed from the pieces' shapes, no data)."""
    out = []
    for m in bucket:
        fake = [torch.empty(m.shape, device="meta") for _ in range(_gather_size(m.entry, config.tensor_model_parallel_size, _expert_ranks(config)))]
        out.extend((name, tuple(t.shape)) for name, t in full_tensors(m.entry, fake, config, vocab_size))
    return out
