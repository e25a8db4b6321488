"""The one batch type that moves between the controller and the workers.

A `DataProto` holds three things for a batch of B samples:

- `batch`: a TensorDict of tensors whose first dimension is B (input_ids [B, L], responses [B, R], ...);
- `non_tensor_batch`: numpy object arrays of length B (data_source, ground truth dicts, uid strings, ...);
- `meta_info`: a small dict that applies to the whole batch (sampling settings, metrics, global step).

Every operation keeps rows aligned across the tensor and non-tensor parts, which is the invariant the rest of
the code relies on (e.g. `uid` must still name the right prompt after a reorder).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch
from tensordict import TensorDict


def _as_object_array(values: Iterable[Any]) -> np.ndarray:
    """Builds a 1-D object array without numpy trying to broadcast nested lists/dicts into more dimensions."""
    values = list(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: `clamp(cumsum(mask) - 1, 0)` along the last dim.

    With left-padded prompts (and right-padded responses) a row then sees exactly the rotary positions it
    would see unpadded; padding slots get 0 and are masked out anyway.
    """
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def response_lengths(batch) -> torch.Tensor:
    """Real tokens of each response `[batch]` (the attention mask over the response columns): a multi-turn
    trajectory's tool responses count, though response_mask, the sampled tokens, leaves them out."""
    return batch["attention_mask"][:, -batch["responses"].shape[-1]:].sum(-1)


@dataclass
class DataProto:
    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = set()
        if self.batch is not None:
            sizes.add(self.batch.batch_size[0])
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim != 1:
                self.non_tensor_batch[key] = value = _as_object_array(value)
            sizes.add(len(value))
        if len(sizes) > 1:
            raise ValueError(f"DataProto columns disagree on batch size: {sorted(sizes)}")

    # ----------------------------------------------------------------------------------------------- build
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        """Builds a batch from plain dicts; the batch size is the first dimension of the tensors."""
        tensors = tensors or {}
        non_tensors = {k: v if isinstance(v, np.ndarray) else _as_object_array(v) for k, v in (non_tensors or {}).items()}
        batch = None
        if tensors:
            size = next(iter(tensors.values())).shape[0]
            batch = TensorDict(dict(tensors), batch_size=[size])
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def __getitem__(self, key: str) -> torch.Tensor | np.ndarray:
        """Column access by name, tensor or non-tensor."""
        if self.batch is not None and key in self.batch.keys():
            return self.batch[key]
        return self.non_tensor_batch[key]

    def __contains__(self, key: str) -> bool:
        return (self.batch is not None and key in self.batch.keys()) or key in self.non_tensor_batch

    # ----------------------------------------------------------------------------------------------- rows
    def index(self, indices: torch.Tensor | np.ndarray | list[int]) -> "DataProto":
        """Rows at `indices`, in that order (a gather; reorder and repeat use it, split/chunk slice instead)."""
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        batch = self.batch[idx] if self.batch is not None else None
        non_tensor = {k: v[idx.numpy()] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def reorder(self, indices: torch.Tensor | np.ndarray | list[int]) -> "DataProto":
        """Permutes rows; `indices` must be a permutation of range(len(self))."""
        if sorted(np.asarray(indices).tolist()) != list(range(len(self))):
            raise ValueError("reorder() needs a permutation of the batch indices")
        return self.index(indices)

    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Each row `repeat_times` times: interleaved (a a b b, n samples of a prompt stay adjacent) or tiled."""
        rows = np.arange(len(self))
        order = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self.index(order)

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Splits into `chunks` equal parts; the batch size must divide evenly (pad first otherwise)."""
        if len(self) % chunks != 0:
            raise ValueError(f"batch of {len(self)} cannot be split into {chunks} equal chunks; pad it first")
        return self.split(len(self) // chunks)

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive pieces of `split_size` rows (the last may be shorter); slices, not gathers."""
        return [self._slice(start, min(start + split_size, len(self))) for start in range(0, len(self), split_size)]

    def _slice(self, start: int, stop: int) -> "DataProto":
        batch = self.batch[start:stop] if self.batch is not None else None
        non_tensor = {k: v[start:stop] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    @staticmethod
    def concat(parts: list["DataProto"]) -> "DataProto":
        """Stacks batches row-wise; meta_info is taken from the first part."""
        if not parts:
            raise ValueError("concat() needs at least one DataProto")
        batches = [p.batch for p in parts if p.batch is not None]
        batch = None
        if batches:
            # Column by column: torch.cat over TensorDicts is ~100x slower than over plain tensors.
            rows = sum(b.batch_size[0] for b in batches)
            batch = TensorDict({k: torch.cat([b[k] for b in batches]) for k in batches[0].keys()}, batch_size=[rows])
        keys = parts[0].non_tensor_batch.keys()
        non_tensor = {k: np.concatenate([p.non_tensor_batch[k] for p in parts]) for k in keys}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(parts[0].meta_info))

    def pad_to_multiple(self, multiple: int) -> tuple["DataProto", int]:
        """Appends copies of the first rows so len is a multiple of `multiple`; returns (padded, num_padded)."""
        num_pad = (-len(self)) % multiple
        if num_pad == 0:
            return self, 0
        extra = np.arange(num_pad) % len(self)
        return DataProto.concat([self, self.index(extra)]), num_pad

    def unpad(self, num_pad: int) -> "DataProto":
        return self if num_pad == 0 else self.index(np.arange(len(self) - num_pad))

    # ----------------------------------------------------------------------------------------------- columns
    def select(self, batch_keys: Iterable[str] = (), non_tensor_keys: Iterable[str] = (), meta_keys: Iterable[str] | None = None) -> "DataProto":
        """A view with only the named columns (shipping less to the workers)."""
        batch_keys, non_tensor_keys = list(batch_keys), list(non_tensor_keys)
        batch = self.batch.select(*batch_keys) if (self.batch is not None and batch_keys) else None
        non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_keys}
        meta = dict(self.meta_info) if meta_keys is None else {k: self.meta_info[k] for k in meta_keys}
        out = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        if batch is None and not non_tensor:
            # A column-less view still has rows; keep the length visible through an empty TensorDict.
            out.batch = TensorDict({}, batch_size=[len(self)])
        return out

    def pop(self, batch_keys: Iterable[str] = (), non_tensor_keys: Iterable[str] = ()) -> "DataProto":
        """Removes the named columns from self and returns them as a new DataProto."""
        batch_keys, non_tensor_keys = list(batch_keys), list(non_tensor_keys)
        popped = self.select(batch_keys, non_tensor_keys, meta_keys=())
        for k in batch_keys:
            del self.batch[k]
        for k in non_tensor_keys:
            del self.non_tensor_batch[k]
        return popped

    def rename(self, names: dict[str, str]) -> "DataProto":
        """Renames tensor columns in place (returned); columns not named keep their names. No-op on an empty batch."""
        if self.batch is not None:
            for old, new in names.items():
                if old in self.batch.keys():
                    self.batch[new] = self.batch[old]
                    del self.batch[old]
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Adds other's columns to self (in place, returned); a shared column must hold equal values."""
        if len(other) != len(self):
            raise ValueError(f"union() of batches with {len(self)} and {len(other)} rows")
        if other.batch is not None and len(other.batch.keys()) > 0:
            if self.batch is None:
                self.batch = TensorDict({}, batch_size=[len(self)])
            for key in other.batch.keys():
                if key in self.batch.keys() and not torch.equal(self.batch[key], other.batch[key]):
                    raise ValueError(f"union(): tensor column '{key}' differs between the two batches")
                self.batch[key] = other.batch[key]
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not np.array_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union(): non-tensor column '{key}' differs between the two batches")
            self.non_tensor_batch[key] = value
        self.meta_info.update(other.meta_info)
        return self

    def to(self, device: str | torch.device) -> "DataProto":
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def copy(self) -> "DataProto":
        batch = self.batch.clone() if self.batch is not None else None
        return DataProto(batch=batch, non_tensor_batch={k: v.copy() for k, v in self.non_tensor_batch.items()}, meta_info=copy.deepcopy(self.meta_info))
