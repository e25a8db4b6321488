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

from rlcore.models.varlen import AttentionOptions, masked_attention


@dataclass(frozen=True)
class KVGeometry:
    """What each layer writes to its cache per token: (key heads, key dim, value heads, value dim). Usually the KV
    heads and head dim twice; DeepSeek-V3's latent attention caches its compressed latent as one "key" head and its
    shared RoPE part as one "value" head, each of its own width."""

    layers: tuple[tuple[int, int, int, int], ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, model: torch.nn.Module, dtype: torch.dtype) -> "KVGeometry":
        """Read off what the model's own attention writes to HF's cache in a one-token forward (whatever its family),
        so the pool holds exactly that. A layer that caches no keys and values (a recurrent state) is refused."""
        with torch.no_grad():
            cache = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device), use_cache=True).past_key_values
        layers = []
        for index, layer in enumerate(cache.layers):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or values is None:
                raise ValueError(f"{model.config.model_type} layer {index} caches a recurrent state ({type(layer).__name__}), which the "
                                 "native engine's KV pool cannot hold; use actor_rollout_ref.rollout.name=vllm")
            layers.append((keys.shape[1], keys.shape[-1], values.shape[1], values.shape[-1]))
        return cls(tuple(layers), dtype)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def bytes_per_token(self) -> int:
        """Keys + values of one token over all layers."""
        return sum(kh * kd + vh * vd for kh, kd, vh, vd in self.layers) * torch.empty((), dtype=self.dtype).element_size()


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
        # Zeroed, not empty: attention reads masked positions too (weight 0), and 0 x NaN from uninitialised memory
        # would be NaN. Stale values of earlier sequences are finite and harmless.
        self.keys = [torch.zeros(num_slots, kh, max_len, kd, dtype=g.dtype, device=self.device) for kh, kd, _, _ in g.layers]
        self.values = [torch.zeros(num_slots, vh, max_len, vd, dtype=g.dtype, device=self.device) for _, _, vh, vd in g.layers]
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
    SDPA with the pool's 4D mask. What the layer asks beyond that (a sliding window, soft-capping, sinks:
    rlcore.models.varlen.AttentionOptions) is applied to the same mask; values may be narrower than keys (MLA)."""
    options = AttentionOptions.of(module, kwargs)
    if options.window is not None and attention_mask is not None:
        attention_mask = _windowed(attention_mask, options.window)
    batch, heads, q_len, head_dim = query.shape
    if q_len != 1:
        if options.plain:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs)
        return masked_attention(query, key, value, attention_mask, scaling, dropout, options).transpose(1, 2), None
    kv_heads = key.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)  # the query heads sharing each KV head (GQA)
    scores = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling is not None else head_dim**-0.5)
    if options.softcap is not None:
        scores = torch.tanh(scores / options.softcap) * options.softcap
    scores = scores.masked_fill(~attention_mask[:, :, 0, : key.shape[2]].unsqueeze(2), float("-inf")) if attention_mask is not None else scores
    if options.sinks is not None:  # a logit per query head that only joins the softmax's denominator
        sinks = options.sinks.to(scores.dtype).reshape(1, kv_heads, heads // kv_heads, 1).expand(batch, -1, -1, 1)
        probs = torch.cat([scores, sinks], dim=-1).softmax(-1, dtype=torch.float32)[..., :-1]
    else:
        probs = scores.softmax(-1, dtype=torch.float32)
    out = torch.matmul(probs.to(value.dtype), value)  # [batch, kv_heads, group, value_dim]
    return out.reshape(batch, 1, heads, value.shape[-1]), None


_last_window: list = [None, None, None]  # (mask, window, windowed mask) of the last call: every sliding layer of a forward shares it


def _windowed(mask: torch.Tensor, window: int) -> torch.Tensor:
    """The pool's bool mask with each query row cut to its last `window` visible keys. Every mask the engine builds
    (prefill_mask, decode_mask) lets a query see one contiguous run of positions ending at itself, so its last
    `window` visible keys are exactly the ones a sliding window keeps."""
    if _last_window[0] is mask and _last_window[1] == window:
        return _last_window[2]
    visible_after = mask.flip(-1).cumsum(-1).flip(-1)  # visible keys at or after each position, per query row
    windowed = mask & (visible_after <= window)
    _last_window[:] = [mask, window, windowed]
    return windowed


# Registered once, process-wide: HF modules pick it up through `config._attn_implementation = ATTENTION_NAME`.
ATTENTION_NAME = "rlcore_kv_pool"
AttentionInterface.register(ATTENTION_NAME, pool_attention)
