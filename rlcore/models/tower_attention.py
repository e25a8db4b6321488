"""A vision tower's attention: bidirectional inside each segment of `cu_seqlens` (an image for Qwen3-VL and
Qwen2.5-VL's full-attention blocks, a window of one for its other blocks), all segments in one call.

HF's Qwen-VL towers hand `cu_seqlens` to their attention function only when its name says flash
(transformers' `is_flash_attention_requested`); under any other name (sdpa, eager, rlcore_varlen) they split the
patches in Python and call attention once per segment: Qwen2.5-VL-7B's 28 window blocks see 64 windows per
448 x 448 image, thousands of small calls per micro-batch, each with its kernel launches on a GPU (on fake tensors,
the memory rehearsal spent 10 minutes there). Registered under TOWER_ATTENTION, the tower attends once per block:

    CUDA, bf16/fp16    flash-attn's varlen kernel (causal=False), else torch's varlen kernel with a full window
    otherwise          SDPA per group of equal-length segments: a CPU run, fp32; windows are mostly of one length,
                       so a few batched calls (rlcore.models.varlen.segment_causal_attention's grouping)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlcore.models.varlen import PLAIN, _varlen_kernel, packed_kernel

TOWER_ATTENTION = "rlcore_flash_tower"  # "flash" in the name is what makes HF's towers pass cu_seqlens


def segment_full_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """query / key / value `[heads, total, dim]` -> `[total, heads, dim]`, each token attending to every token of
    its segment; segments of equal length share one batched SDPA call."""
    starts, lengths = cu_seq_lens[:-1].long(), cu_seq_lens.diff().long()
    out = query.new_empty(query.shape[1], query.shape[0], value.shape[2])
    for length in lengths.unique().tolist():
        rows = starts[lengths == length, None] + torch.arange(length, device=query.device)  # [n, length] token indices
        q, k, v = (t[:, rows].transpose(0, 1) for t in (query, key, value))  # [n, heads, length, dim]
        out[rows] = F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)
    return out


def tower_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """HF attention-interface function for the tower: query / key / value `[1, heads, patches, dim]` with
    `cu_seq_lens_q` -> (`[1, patches, heads, dim]`, None)."""
    cu_seq_lens = kwargs["cu_seq_lens_q"]
    kernel = packed_kernel(query.device, query.dtype, dropout)
    if kernel in ("flash_attn", "torch_varlen"):
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [patches, heads, dim]
        max_len = kwargs.get("max_length_q") or int(cu_seq_lens.diff().max())
        out = _varlen_kernel(kernel, q, k, v, cu_seq_lens.to(torch.int32), max_len, scaling, dropout, (-1, -1), PLAIN, causal=False)
        return out[None], None
    if dropout:
        raise ValueError("the vision tower's attention takes no dropout off the GPU's flash kernels (vision_config.attention_dropout)")
    return segment_full_attention(query[0], key[0], value[0], cu_seq_lens, scaling)[None], None


def use_tower_attention(model: torch.nn.Module) -> None:
    """Points a vision-language model's tower (its vision_config) at `tower_attention`."""
    from transformers import AttentionInterface

    AttentionInterface.register(TOWER_ATTENTION, tower_attention)
    model.config.vision_config._attn_implementation = TOWER_ATTENTION
