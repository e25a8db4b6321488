"""Splitting a rank's batch into micro-batches: a fixed sample count, or a token budget (use_dynamic_bsz).

Under a token budget every data-parallel rank must run the same number of micro-batches (FSDP gathers
parameters collectively for each forward), so the ranks agree on the count; the rows are regrouped, and
`restore_order` puts per-sample outputs back into the batch's original order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from rlcore.data.seqlen_balancing import budget_partitions
from rlcore.protocol import DataProto
from rlcore.utils.dist import ReduceOp, all_reduce_values


@dataclass(frozen=True)
class MicroBatchSpec:
    """How one pass (log-prob, values, update) splits this rank's batch."""

    rows: Optional[int] = None          # samples per micro-batch (use_dynamic_bsz=False)
    max_tokens: Optional[int] = None    # token budget per micro-batch per rank (use_dynamic_bsz=True)
    packed: bool = False                # the engine packs sequences (use_remove_padding): cost = valid tokens

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.max_tokens is None):
            raise ValueError(f"a micro-batch spec needs exactly one of rows / max_tokens, got {self}")

    @property
    def dynamic(self) -> bool:
        return self.max_tokens is not None


def sequence_lengths(data: DataProto) -> list[int]:
    """Valid (prompt + response) tokens per sample."""
    return data.batch["attention_mask"].sum(-1).tolist()


def _agree_on_count(count: int) -> tuple[int, int]:
    """(max, min) of `count` over the data-parallel ranks."""
    if not dist.is_initialized():
        return count, count
    most, neg_fewest = all_reduce_values([count, -count], op=ReduceOp.MAX)
    return int(most), int(-neg_fewest)


def token_budget_partitions(lengths: list[int], max_tokens: int, packed: bool) -> list[list[int]]:
    """Budget partitions with the same count on every rank: each rank asks for at least the largest count any
    rank needed, until all agree (a partition may need one more part than asked to stay within budget)."""
    num_parts = 1
    while True:
        parts = budget_partitions(lengths, max_tokens, packed, min_parts=num_parts)
        most, fewest = _agree_on_count(len(parts))
        if most == fewest:
            return parts
        num_parts = most


def trim_padding(mb: DataProto) -> DataProto:
    """Drops the columns that are padding in every row: left of the earliest prompt start and right of the
    longest response. Exact: positions travel in `position_ids`. Columns are recognised by width: L
    (input_ids: prompt + response) or R (responses); other tensors are left alone."""
    width, response_len = mb.batch["input_ids"].shape[-1], mb.batch["responses"].shape[-1]
    prompt_len = width - response_len
    valid = mb.batch["attention_mask"].bool().any(0)
    first = int(valid[:prompt_len].nonzero()[0]) if valid[:prompt_len].any() else prompt_len - 1
    response_cols = valid[prompt_len:].nonzero()
    keep = int(response_cols[-1]) + 1 if len(response_cols) else 1
    tensors = {}
    for key, value in mb.batch.items():
        if value.dim() >= 2 and value.shape[1] == width:
            value = value[:, first : prompt_len + keep]
        elif value.dim() >= 2 and value.shape[1] == response_len:
            value = value[:, :keep]
        tensors[key] = value
    return DataProto.from_dict(tensors, mb.non_tensor_batch, mb.meta_info)


def make_micro_batches(data: DataProto, spec: MicroBatchSpec) -> tuple[list[DataProto], Optional[np.ndarray]]:
    """Micro-batches of this rank's `data`, and the row order they hold (None: unchanged order).

    Fixed: consecutive slices of `spec.rows` samples, at the batch's full width (verl's padded behaviour).
    Dynamic: token-budget parts (the same count on every rank), each trimmed to its own longest sample.
    """
    if not spec.dynamic:
        return data.split(spec.rows), None
    parts = token_budget_partitions(sequence_lengths(data), spec.max_tokens, spec.packed)
    return [trim_padding(data.index(p)) for p in parts], np.concatenate(parts)


def pad_responses(t: torch.Tensor, response_len: int) -> torch.Tensor:
    """Right-pads a `[batch, r, ...]` per-token output of a trimmed micro-batch back to `[batch, response_len, ...]`
    (a teacher's top-k tokens carry a trailing k)."""
    missing = response_len - t.shape[1]
    return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, missing)) if missing > 0 else t


def restore_order(outputs: dict[str, torch.Tensor], order: Optional[np.ndarray]) -> dict[str, torch.Tensor]:
    """Rows of `outputs` are data rows `order`; returns them in the data's own order."""
    if order is None:
        return outputs
    inverse = torch.as_tensor(np.argsort(order))
    return {k: v[inverse] for k, v in outputs.items()}
