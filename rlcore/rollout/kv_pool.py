"""The native engine's KV cache: one preallocated pool of sequence slots, sized from a memory budget.

Each layer's keys and values live in `[slot, kv_head, position, head_dim]` tensors allocated once per rollout (or
kept across rollouts while the shape fits) and freed by `release()`, the engine's `sleep()`. The decode batch
always occupies slots `[0, rows)`: a finished sequence's slot is refilled by moving the last active slot into it,
so the batch the model attends over is a view of the pool, never a gather, and nothing is concatenated per token
(HF's DynamicCache re-allocates every layer's cache at every step).

Positions inside a slot: a prompt is written at `[0, prompt_len)` with its left padding (masked out by `start`),
generated tokens follow. The model sees these through `SlotCache`, which HF attention layers call as their
cache (only `update()` is used when position ids and a 4D mask are passed in).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward


@dataclass(frozen=True)
class KVGeometry:
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> "KVGeometry":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, dtype)

    @property
    def bytes_per_token(self) -> int:
        """Keys + values of one token over all layers."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


def slots_for_budget(geometry: KVGeometry, max_len: int, budget_bytes: float | None) -> int | None:
    """How many sequences of `max_len` tokens fit in `budget_bytes` (None: no budget, no limit)."""
    if budget_bytes is None:
        return None
    return int(max(budget_bytes, 0) // (geometry.bytes_per_token * max_len))


class KVPool:
    """`num_slots` sequences of up to `max_len` tokens; `start[s]` is slot s's first unmasked position."""

    def __init__(self, geometry: KVGeometry, device: torch.device) -> None:
        self.geometry, self.device = geometry, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.num_slots = self.max_len = 0
        self.start = torch.zeros(0, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.max_len * self.geometry.bytes_per_token

    def acquire(self, num_slots: int, max_len: int) -> None:
        """Allocates the pool, unless the one held already has this shape (kept while the engine is awake)."""
        if self.keys and (self.num_slots, self.max_len) == (num_slots, max_len):
            return
        self.release()
        g = self.geometry
        shape = (num_slots, g.kv_heads, max_len, g.head_dim)
        # Zeroed, not empty: attention reads masked positions too (weight 0), and 0 x NaN from uninitialised memory
        # would be NaN. Stale values of earlier sequences are finite and harmless.
        self.keys = [torch.zeros(shape, dtype=g.dtype, device=self.device) for _ in range(g.num_layers)]
        self.values = [torch.zeros(shape, dtype=g.dtype, device=self.device) for _ in range(g.num_layers)]
        self.num_slots, self.max_len = num_slots, max_len
        self.start = torch.zeros(num_slots, dtype=torch.long, device=self.device)

    def release(self) -> None:
        self.keys, self.values = [], []
        self.num_slots = self.max_len = 0

    def copy_slots(self, src: torch.Tensor | slice, dst: torch.Tensor | slice, length: int) -> None:
        """Slot contents `[0, length)` (every layer) and start offsets from `src` to `dst`."""
        for cache in (*self.keys, *self.values):
            cache[dst, :, :length] = cache[src, :, :length]
        self.start[dst] = self.start[src]


class SlotCache:
    """What the model's attention layers see as their cache for one forward over slots `[first, first+rows)`
    (every `stride`-th slot when a prefill writes one prompt per group). `positions`: where each row's first new
    token goes, an int (prefill: 0) or a `[rows]` tensor (decode: one token per row). `kv_len`: how many leading
    positions of each slot the attention reads."""

    def __init__(self, pool: KVPool, first: int, rows: int, positions: int | torch.Tensor, kv_len: int, stride: int = 1) -> None:
        self.pool, self.positions, self.kv_len = pool, positions, kv_len
        self.slots = slice(first, first + rows * stride, stride)
        self.rows = None if isinstance(positions, int) else torch.arange(first, first + rows * stride, stride, device=pool.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """HF's `Cache.update(key_states, value_states, layer_idx, *args, **kwargs)`: writes the new keys/values and
        returns `[rows, kv_heads, kv_len, head_dim]` views of the slots. What HF passes after the layer index (a
        positional `cache_kwargs` dict before 5.24, the attention kwargs as `kwargs=` since) is not needed: the
        positions are this cache's own. tests/rollout/test_kv_pool.py checks this signature against HF's."""
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        if isinstance(self.positions, int):
            end = self.positions + key_states.shape[2]
            keys[self.slots, :, self.positions : end] = key_states
            values[self.slots, :, self.positions : end] = value_states
        else:  # one new token per row, each at its own position
            keys[self.rows, :, self.positions] = key_states[:, :, 0]
            values[self.rows, :, self.positions] = value_states[:, :, 0]
        return keys[self.slots, :, : self.kv_len], values[self.slots, :, : self.kv_len]


def cache_keyword(model) -> str:
    """The keyword a HF causal LM's forward takes its cache under: `cache` since transformers 5.24 (where
    `past_key_values` is deprecated until 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill_mask(start: torch.Tensor, length: int) -> torch.Tensor:
    """`[rows, 1, length, length]` bool: causal over positions >= start. A padding query attends to itself only,
    so no softmax row is empty (an all-masked row gives NaN, which would reach the cache)."""
    pos = torch.arange(length, device=start.device)
    causal = (pos[None, :, None] >= pos[None, None, :]) & (pos[None, None, :] >= start[:, None, None])
    return (causal | torch.eye(length, dtype=torch.bool, device=start.device))[:, None]


def decode_mask(start: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """`[rows, 1, 1, kv_len]` bool: each row's new token sees its own positions `[start, position]`."""
    pos = torch.arange(kv_len, device=start.device)
    return ((pos >= start[:, None]) & (pos <= positions[:, None]))[:, None, None]


def pool_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The native engine's attention (registered as `ATTENTION_NAME` for the HF-module path, called directly by the
    fused decoder). A decode step (one query per row) is two small batched matmuls and a softmax over the pool's
    view: ~120 us per layer on the rollout bench, where CPU SDPA's flash kernel took ~440 us. Prefills go to torch
    SDPA with the pool's 4D mask."""
    batch, heads, q_len, head_dim = query.shape
    if q_len != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs)
    kv_heads = key.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)  # the query heads sharing each KV head (GQA)
    scores = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling is not None else head_dim**-0.5)
    scores = scores.masked_fill(~attention_mask[:, :, 0, : key.shape[2]].unsqueeze(2), float("-inf")) if attention_mask is not None else scores
    out = torch.matmul(scores.softmax(-1, dtype=torch.float32).to(value.dtype), value)  # [batch, kv_heads, group, head_dim]
    return out.reshape(batch, 1, heads, head_dim), None


# Registered once, process-wide: HF modules pick it up through `config._attn_implementation = ATTENTION_NAME`.
ATTENTION_NAME = "rlcore_kv_pool"
AttentionInterface.register(ATTENTION_NAME, pool_attention)
