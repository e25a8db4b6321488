"""Ulysses sequence parallelism: the ranks of one sequence-parallel (sp) group share a micro-batch, each holds a
contiguous slice of its packed tokens, and attention runs on whole sequences over heads / sp.

Everything outside attention is per token, so a rank computes it on its slice alone; activations shrink by sp.
Attention needs every token of a sequence: an all-to-all before it turns `[heads, tokens / sp]` into
`[heads / sp, tokens]` (each rank keeps a group of heads, for the whole packed row), and one after it turns the
output back. The packed row is padded to a multiple of sp; the padding is a sequence of its own in `cu_seq_lens`,
so no real token attends to it and its values stay finite (a NaN there would reach the weight gradients as 0 x NaN).

The per-token outputs (log-probs, values) are gathered so that every rank of the group holds the micro-batch's
whole `[response tokens]` and computes the same loss. The gather's backward keeps this rank's part of that
gradient, times sp: each rank seeds the backward of its own tokens, the group's gradients sum to sp x the true
one, and FSDP's average over the world (dp x sp ranks) leaves the average over data-parallel replicas, as without
sp. Loss normalisers are counted over the data-parallel group, whose ranks hold different samples.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlcore.models.varlen import ULYSSES_ATTR, PackedBatch
from rlcore.utils.dist import all_gather_flat, all_to_all


class _AllToAll(torch.autograd.Function):
    """`x` split into sp equal chunks along dim 0, chunk j sent to rank j; returns the chunks received, stacked
    along dim 0 in rank order. Its own inverse, so backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_to_all(grad, ctx.group), None


class _GatherSlices(torch.autograd.Function):
    """Concatenates every rank's `[n_r, ...]` in rank order (the counts are known on every rank); backward keeps
    this rank's rows of the gradient times sp (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, counts: list[int], rank: int, group) -> torch.Tensor:
        ctx.rank, ctx.counts = rank, counts
        width = max(counts)
        padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, width - x.shape[0])).contiguous()
        gathered = padded.new_empty(len(counts) * padded.numel())
        all_gather_flat(gathered, padded.reshape(-1), group)
        pieces = gathered.view(len(counts), *padded.shape)
        return torch.cat([p[:n] for p, n in zip(pieces, counts)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]] * len(ctx.counts), None, None, None


@dataclass
class SequenceShard:
    """This rank's slice `[start, start + length)` of a packed row padded to sp x length tokens."""

    start: int
    length: int
    response_counts: list[int]  # response-predicting states in each rank's slice
    local_index: torch.Tensor   # their positions within this rank's slice


class Ulysses:
    """One rank's view of its sequence-parallel group."""

    def __init__(self, group) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def shard(self, packed: PackedBatch, index: torch.Tensor) -> tuple[PackedBatch, SequenceShard]:
        """Pads the packed row to a multiple of sp (the padding a sequence of its own) and keeps this rank's slice
        of input_ids and position_ids; cu_seq_lens keep describing the whole row, which attention sees. `index`:
        the ascending packed positions whose states give the outputs (a state and the token it predicts may sit
        on two ranks: each rank computes the outputs of the states it holds)."""
        total = packed.input_ids.shape[-1]
        length = -(-total // self.size)
        pad = length * self.size - total
        ids, pos, kwargs = packed.input_ids, packed.position_ids, dict(packed.attention_kwargs)
        if pad:
            ids = F.pad(ids, (0, pad))
            pos = torch.cat([pos, torch.arange(pad, device=pos.device, dtype=pos.dtype)[None]], -1)
            cu = kwargs["cu_seq_lens_q"]
            cu = torch.cat([cu, cu.new_tensor([total + pad])])
            longest = max(kwargs["max_length_q"], pad)
            kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        start = self.rank * length
        counts = torch.bincount(torch.div(index, length, rounding_mode="floor"), minlength=self.size)
        mine = (index >= start) & (index < start + length)
        local = replace(packed, input_ids=ids[:, start : start + length], position_ids=pos[:, start : start + length],
                        attention_kwargs=kwargs)
        return local, SequenceShard(start, length, counts.tolist(), index[mine] - start)

    def local_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """This rank's slice of `[rows, 1, total]` position ids (a vision-language model's four rows), each row
        padded as `shard` pads the text positions."""
        total = positions.shape[-1]
        length = -(-total // self.size)
        pad = torch.arange(length * self.size - total, device=positions.device, dtype=positions.dtype)
        padded = torch.cat([positions, pad.expand(*positions.shape[:-1], len(pad))], -1)
        return padded[..., self.rank * length: (self.rank + 1) * length]

    def local_tokens(self, values: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a per-token tensor `[total, ...]` over the packed row, laid out as `shard` lays out
        input_ids (the row padded with `fill` to a multiple of sp)."""
        length = -(-len(values) // self.size)
        padded = torch.cat([values, fill.expand(length * self.size - len(values), *values.shape[1:])])
        return padded[self.rank * length : (self.rank + 1) * length]

    def all_tokens(self, local: torch.Tensor, total: int) -> torch.Tensor:
        """The inverse of `local_tokens` (not differentiable): every rank's slice -> `[total, ...]` on every rank.
        Integers travel as int64 (gloo gathers no int16)."""
        wide = local if local.is_floating_point() else local.long()
        out = wide.new_empty(self.size * wide.numel())
        all_gather_flat(out, wide.reshape(-1), group=self.group)
        return out.view(self.size * len(local), *local.shape[1:])[:total].to(local.dtype)

    def mine(self, shard: SequenceShard, values: torch.Tensor) -> torch.Tensor:
        """This rank's part of a per-response-token tensor `[..., num_response_tokens]` (the tokens its states predict)."""
        start = sum(shard.response_counts[: self.rank])
        return values[..., start : start + shard.response_counts[self.rank]]

    def gather(self, shard: SequenceShard, outputs: torch.Tensor) -> torch.Tensor:
        """Every rank's `[n_r, channels]` outputs -> the micro-batch's `[num_response_tokens, channels]`."""
        return _GatherSlices.apply(outputs, shard.response_counts, self.rank, self.group)

    def heads_to_sequence(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """`[heads, tokens / sp, dim]` -> `[heads / sp, tokens, dim]`. K/V with fewer heads than sp (or a count
        sp does not divide) are repeated up to the query's heads first, as grouped-query attention reads them."""
        if x.shape[0] % self.size:
            x = x.repeat_interleave(num_heads // x.shape[0], dim=0)
        heads, length, dim = x.shape
        chunks = x.reshape(self.size, heads // self.size, length, dim)           # chunk j: rank j's heads
        received = _AllToAll.apply(chunks, self.group)                           # [sp, heads / sp, length, dim]
        return received.permute(1, 0, 2, 3).reshape(heads // self.size, self.size * length, dim)

    def sequence_to_heads(self, out: torch.Tensor) -> torch.Tensor:
        """Attention's `[tokens, heads / sp, dim]` -> `[tokens / sp, heads, dim]` (this rank's slice, every head)."""
        tokens, heads, dim = out.shape
        chunks = out.reshape(self.size, tokens // self.size, heads, dim)         # chunk j: rank j's tokens
        received = _AllToAll.apply(chunks, self.group)                           # [sp, tokens / sp, heads / sp, dim]
        return received.permute(1, 0, 2, 3).reshape(tokens // self.size, self.size * heads, dim)


def attach_ulysses(blocks: torch.nn.ModuleList, ulysses: Ulysses) -> None:
    """Marks every decoder block's attention for sequence parallelism. An attribute on the module, not a context
    around the forward: activation checkpointing recomputes attention during backward, outside any context."""
    for block in blocks:
        attention = getattr(block, "self_attn", None)
        if attention is None:
            raise NotImplementedError(f"{type(block).__name__} has no self_attn module: Ulysses sequence parallelism "
                                      "supports decoder blocks laid out as Llama/Qwen2/Qwen3 (block.self_attn)")
        setattr(attention, ULYSSES_ATTR, ulysses)


def check_heads(num_heads: int, sp: int) -> str | None:
    """Why `sp` cannot split attention of `num_heads` query heads, or None. K/V heads are repeated when needed."""
    if num_heads % sp:
        return f"the model's {num_heads} attention heads do not divide over {sp} sequence-parallel ranks"
    return None
