"""Writes an HF safetensors checkpoint from a stream of (name, tensor), so an export never holds the whole model:
host memory peaks at one shard (`max_shard_bytes`), however large the model."""

from __future__ import annotations

import json
import os
from typing import Iterable

import torch
from safetensors.torch import save_file

from rlcore.families import family_of
from rlcore.models.experts import to_checkpoint_names

SHARD_BYTES = 4 * 2**30  # as transformers' save_pretrained default ("5GB" there; a round 4 GiB here)


def save_safetensors_stream(hf_dir: str, named_tensors: Iterable[tuple[str, torch.Tensor]], write: bool = True,
                            max_shard_bytes: int = SHARD_BYTES, split_experts: bool = True) -> None:
    """`model.safetensors`, or `model-0000i-of-0000N.safetensors` + `model.safetensors.index.json` when the tensors
    exceed `max_shard_bytes`. Each shard is written as soon as it is full, under a temporary name until the count
    is known. The stream may be collective (gathers over ranks): every rank consumes it, only `write` ranks write.
    A MoE's fused experts go out under the per-expert names its checkpoints use (rlcore.models.experts.splits_experts)."""
    shard: dict[str, torch.Tensor] = {}
    written: list[tuple[str, list[str], int]] = []  # (temporary file, tensor names, bytes)

    def flush() -> None:
        path = os.path.join(hf_dir, f".partial-{len(written)}.safetensors")
        save_file(shard, path, metadata={"format": "pt"})
        written.append((path, list(shard), sum(t.numel() * t.element_size() for t in shard.values())))
        shard.clear()

    if write:
        os.makedirs(hf_dir, exist_ok=True)
    size = 0
    for name, tensor in to_checkpoint_names(named_tensors, split_experts):
        if not write:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
            size = 0
        shard[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
    if not write:
        return
    flush()
    if len(written) == 1:
        os.replace(written[0][0], os.path.join(hf_dir, "model.safetensors"))
        return
    weight_map = {}
    for i, (path, names, _) in enumerate(written):
        final = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        os.replace(path, os.path.join(hf_dir, final))
        weight_map.update(dict.fromkeys(names, final))
    with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(b for *_, b in written)}, "weight_map": weight_map}, f, indent=2)


def head_model_config(config, kind: str):
    """The config an engine exports with its weights: a causal LM's own; a scalar-head model names the HF class
    that loads it as trained, with one label (a critic: `*ForTokenClassification`, read at every token, what
    `critic.model.path` loads; a reward model: `*ForSequenceClassification`, read at the last token). A causal LM
    keeps the keys vLLM reads that transformers' own save leaves out (DeepSeek-V3's router: without them vLLM serves
    the export with a softmax router and no bias)."""
    if kind == "causal_lm":
        family = family_of(config.to_dict())
        for key, value in (family.vllm_config if family is not None else {}).items():
            if getattr(config, key, None) is None:
                setattr(config, key, value)
        return config
    out = type(config).from_dict(config.to_dict())
    out.num_labels = 1
    family = (config.architectures or [type(config).__name__.removesuffix("Config")])[0].split("For")[0]
    out.architectures = [f"{family}For{'Sequence' if kind == 'reward' else 'Token'}Classification"]
    return out
