"""Packed sequences (`use_remove_padding`): a micro-batch's valid tokens in one row `[1, total_tokens]`, position
ids restarting at 0 for every sequence, and attention confined to each sequence (varlen).

HF models get `rlcore_varlen` (below) as their attention implementation, megatron-core its THD path; both call
`packed_causal_attention`, which picks the kernel per call (`packed_kernel`):
- CUDA, bf16/fp16: flash-attn's varlen kernel when installed, else torch's own (`torch.nn.attention.varlen`,
  torch >= 2.10), else one padded SDPA call over the sequences laid out `[n, heads, max_len, dim]`.
  The GPU never runs the per-sequence loop: on an H100 that loop made the packed update 43x slower than padding.
- CUDA in fp32 or with attention dropout: the padded SDPA call (the flash kernels take neither).
- CPU: exact causal SDPA per group of equal-length sequences (`segment_causal_attention`). It costs sum(len^2)
  attention work rather than total_tokens^2 of one block-diagonal mask, and needs no compiler.
The model call passes the same `cu_seq_lens_*` kwargs whatever the kernel; HF forwards them to every attention layer.

A layer may ask for more than causal softmax attention (`AttentionOptions`, from HF's attention kwargs): a sliding
window (Mistral, Gemma, GPT-OSS), tanh soft-capping of the logits (Gemma 2), a learned sink per head (GPT-OSS); its
values may have a head dim of their own (DeepSeek-V3's MLA). Each is honoured on every kernel: flash-attn takes the
window and the cap, torch's varlen kernel the window, and whatever a kernel cannot take runs as explicit masked
attention per group of equal-length sequences (CPU) or over the padded layout (CUDA).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

VARLEN_ATTENTION = "rlcore_varlen"
PREFIX_KWARG = "rlcore_prefix_groups"  # the attention kwarg of a prefix-grouped packing (rlcore.models.prefix_grouper)
ULYSSES_ATTR = "rlcore_ulysses"  # an attention module's Ulysses group (rlcore.models.ulysses.attach_ulysses)


@dataclass(frozen=True)
class AttentionOptions:
    """What a layer asks of attention beyond causal softmax, as HF's attention modules pass it."""

    window: int | None = None            # each query sees itself and the window - 1 tokens before it (`sliding_window`)
    softcap: float | None = None         # logits -> softcap * tanh(logits / softcap) before the softmax (`softcap`)
    sinks: torch.Tensor | None = None    # [heads]: a logit per head in each softmax's denominator, weighing no value (`s_aux`)

    @classmethod
    def of(cls, module: torch.nn.Module, kwargs: dict) -> "AttentionOptions":
        # The kwarg decides when the layer passes one (Mistral passes its config's window; Qwen2 and Gemma pass
        # None on their global layers); a module that only carries the attribute is read from it.
        window = kwargs["sliding_window"] if "sliding_window" in kwargs else getattr(module, "sliding_window", None)
        return cls(window=window or None, softcap=kwargs.get("softcap") or None, sinks=kwargs.get("s_aux"))

    def within(self, max_len: int) -> "AttentionOptions":
        """Without a window no sequence reaches (a window of at least the longest length is full attention)."""
        return replace(self, window=None) if self.window is not None and self.window >= max_len else self

    def heads(self, first: int, count: int) -> "AttentionOptions":
        """The options of query heads [first, first + count) (Ulysses: a rank attends with its group of heads)."""
        return self if self.sinks is None else replace(self, sinks=self.sinks[first : first + count])

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None


PLAIN = AttentionOptions()


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float | None,
                     dropout: float, options: AttentionOptions) -> torch.Tensor:
    """Attention with every option applied, as HF's eager functions compute it: q `[n, heads, L, d]`, k `[n, kv_heads,
    S, d]`, v `[n, kv_heads, S, dv]`, `allowed` `[n or 1, 1, L, S]` bool (which key each query sees) -> `[n, heads, L, dv]`."""
    heads = q.shape[1]
    k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if options.softcap is not None:
        scores = torch.tanh(scores / options.softcap) * options.softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if options.sinks is not None:
        sinks = options.sinks.to(scores.dtype).reshape(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sinks], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if options.sinks is not None:
        probs = probs[..., :-1]
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return torch.matmul(probs.to(v.dtype), v)


def causal_window(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """`[1, 1, length, length]` bool: key j is visible to query i when j <= i and, with a window, i - j < window."""
    pos = torch.arange(length, device=device)
    distance = pos[:, None] - pos[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    return allowed[None, None]


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, dropout: float,
            options: AttentionOptions) -> torch.Tensor:
    """Causal attention of `[n, heads, L, d]` over `[n, kv_heads, L, dv]`: torch's SDPA when nothing else is asked."""
    options = options.within(q.shape[2])
    if options.plain:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout, enable_gqa=q.shape[1] != k.shape[1])
    return masked_attention(q, k, v, causal_window(q.shape[2], options.window, q.device), scale, dropout, options)


def segment_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                             scale: float | None = None, dropout: float = 0.0, options: AttentionOptions = PLAIN) -> torch.Tensor:
    """Causal attention inside each packed sequence: query `[heads, total, dim]`, key `[kv_heads, total, dim]`, value
    `[kv_heads, total, value_dim]`, `cu_seq_lens` `[num_seqs + 1]` -> `[total, heads, value_dim]`. Sequences of equal
    length share one batched call: many short sequences cost a few calls, not one each."""
    starts, lengths = cu_seq_lens[:-1].long(), cu_seq_lens.diff().long()
    out = query.new_empty(query.shape[1], query.shape[0], value.shape[2])  # [total, heads, value_dim]
    for length in lengths.unique().tolist():
        rows = starts[lengths == length, None] + torch.arange(length, device=query.device)  # [n, length] token indices
        q, k, v = (t[:, rows].transpose(0, 1) for t in (query, key, value))  # [n, heads, length, dim]
        out[rows] = _causal(q, k, v, scale, dropout, options).transpose(1, 2)  # [n, length, heads, value_dim]
    return out


def padded_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int,
                            scale: float | None = None, dropout: float = 0.0, options: AttentionOptions = PLAIN) -> torch.Tensor:
    """The same function as `segment_causal_attention` as ONE SDPA call: each sequence scattered into a row of
    `[n, heads, max_len, dim]`, right-padded. Causal masking alone keeps every real query off the padding keys
    (they come after it); the padded queries' outputs are never gathered back."""
    starts, lengths = cu_seq_lens[:-1].long(), cu_seq_lens.diff().long()
    columns = torch.arange(max_len, device=query.device)
    valid = columns < lengths[:, None]                                     # [n, max_len]
    index = (starts[:, None] + columns).clamp(max=query.shape[1] - 1)      # token of each (row, column)
    q, k, v = (t[:, index].transpose(0, 1) for t in (query, key, value))   # [n, heads, max_len, dim]
    return _causal(q, k, v, scale, dropout, options).transpose(1, 2)[valid]  # [total, heads, value_dim]


@functools.cache
def _flash_attn_varlen():
    if importlib.util.find_spec("flash_attn") is None:
        return None
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


@functools.cache
def _torch_varlen():
    """torch's varlen flash kernel and whether it takes GQA itself (torch 2.11's does not: K/V are repeated)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, False
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


def packed_kernel(device: torch.device, dtype: torch.dtype, dropout: float = 0.0, options: AttentionOptions = PLAIN) -> str:
    """Which kernel `packed_causal_attention` runs: flash_attn | torch_varlen | padded_sdpa | segments. Attention
    sinks go to the padded layout (no varlen kernel takes them); soft-capping needs flash-attn."""
    if device.type != "cuda":
        return "segments"
    if dtype in (torch.bfloat16, torch.float16) and options.sinks is None:
        if _flash_attn_varlen() is not None:
            return "flash_attn"
        if dropout == 0.0 and options.softcap is None and _torch_varlen()[0] is not None:
            return "torch_varlen"
    return "padded_sdpa"


def packed_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor, max_len: int,
                            scale: float | None = None, dropout: float = 0.0, kernel: str | None = None,
                            options: AttentionOptions = PLAIN) -> torch.Tensor:
    """Causal attention inside each packed sequence: query `[heads, total, dim]`, key `[kv_heads, total, dim]`, value
    `[kv_heads, total, value_dim]`, `cu_seq_lens` `[num_seqs + 1]` int32 -> `[total, heads, value_dim]`, with the
    layer's `options`, on the fastest kernel the device has (`kernel` forces one, for tests)."""
    options = options.within(max_len)
    kernel = kernel or packed_kernel(query.device, query.dtype, dropout, options)
    if kernel == "segments":
        return segment_causal_attention(query, key, value, cu_seq_lens, scale, dropout, options)
    if kernel == "padded_sdpa":
        return padded_causal_attention(query, key, value, cu_seq_lens, max_len, scale, dropout, options)
    value_dim = value.shape[-1]
    if value_dim != query.shape[-1]:  # the flash kernels take one head dim: MLA's narrower values ride zero-padded
        value = F.pad(value, (0, query.shape[-1] - value_dim))
    q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [total, heads, dim], as the varlen kernels take them
    cu = cu_seq_lens.to(torch.int32)
    window = (options.window - 1, 0) if options.window is not None else (-1, 0)
    return _varlen_kernel(kernel, q, k, v, cu, max_len, scale, dropout, window, options)[..., :value_dim]


def _varlen_kernel(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float | None,
                   dropout: float, window: tuple[int, int], options: AttentionOptions, causal: bool = True) -> torch.Tensor:
    """`window`: (left, right) as both kernels take it; (-1, 0) causal, (-1, -1) full (rlcore.models.tower_attention)."""
    if kernel == "flash_attn":
        # its backward sums dQ over key blocks with atomics unless told not to: deterministic under the run's switches
        # (rlcore.utils.determinism). torch's own flash backward below is deterministic only with warn_only=False.
        return _flash_attn_varlen()(q, k, v, cu, cu, max_len, max_len, dropout_p=dropout, softmax_scale=scale, causal=causal,
                                    window_size=window, softcap=options.softcap or 0.0,
                                    deterministic=torch.are_deterministic_algorithms_enabled())
    varlen_attn, takes_gqa = _torch_varlen()
    gqa = {}
    if q.shape[1] != k.shape[1]:
        if takes_gqa:
            gqa = {"enable_gqa": True}
        else:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=window, **gqa)


def segment_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """HF attention-interface function: query `[1, heads, total, dim]`, key/value `[1, kv_heads, total, dim]`
    -> (`[1, total, heads, dim]`, None). Without `cu_seq_lens_q` (an unpacked call) it is plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = kwargs.get(PREFIX_KWARG)
    if groups is not None:  # the prefix grouper's packing (rlcore.models.prefix_grouper): each prompt once, its responses after it
        return groups.attend(query[0], key[0], value[0], scaling, dropout)[None], None
    options = AttentionOptions.of(module, kwargs)
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:  # an unpacked call: HF's mask says what each query sees
        if options.plain:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        if attention_mask is None:
            allowed = causal_window(query.shape[2], options.window, query.device)
        else:
            allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        return masked_attention(query, key, value, allowed, scaling, dropout, options).transpose(1, 2), None
    max_len = kwargs.get("max_length_q") or int(cu_seq_lens.diff().max())
    ulysses = getattr(module, ULYSSES_ATTR, None)
    if ulysses is None:
        return packed_causal_attention(query[0], key[0], value[0], cu_seq_lens, max_len, scaling, dropout, options=options)[None], None
    # This rank holds a slice of the tokens for every head: whole sequences for heads / sp, attention, and back.
    heads = query.shape[1]
    q, k, v = (ulysses.heads_to_sequence(t[0], heads) for t in (query, key, value))
    options = options.heads(ulysses.rank * q.shape[0], q.shape[0])
    return ulysses.sequence_to_heads(packed_causal_attention(q, k, v, cu_seq_lens, max_len, scaling, dropout, options=options))[None], None


def _segment_mask(**kwargs):
    # A packed call passes no 2-D mask: segments bound the attention, no dense mask is built. An unpacked call
    # (attention_mask given) gets the ordinary SDPA mask.
    from transformers.masking_utils import sdpa_mask

    return None if kwargs.get("attention_mask") is None else sdpa_mask(**kwargs)


def padded_attention(config) -> str:
    """HF's own attention for padded batches: sdpa where the model class takes it, else eager (Gemma 2 and GPT-OSS:
    torch's SDPA has no soft-capping and no sinks, and HF refuses it for them)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else None
    return "eager" if cls is not None and not cls._supports_sdpa else "sdpa"


def attention_implementation(packed: bool) -> str | None:
    """The HF `attn_implementation` for a training model: `rlcore_varlen` for packed batches (whose kernel
    `packed_causal_attention` picks per call: flash-attn's, torch's varlen, padded SDPA, segments); None for padded
    ones: the model's own (`padded_attention`)."""
    if not packed:
        return None
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, segment_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, _segment_mask)
    return VARLEN_ATTENTION


@dataclass
class PackedBatch:
    input_ids: torch.Tensor         # [1, total_tokens]
    position_ids: torch.Tensor      # [1, total_tokens], restarting at 0 per sequence
    attention_kwargs: dict          # cu_seq_lens_q/k [num_seqs + 1] int32, max_length_q/k
    response_index: torch.Tensor    # [num_response_tokens]: packed position of the state before each response token
    response_valid: torch.Tensor    # [batch, response_len] bool: which (row, token) those states belong to


def pack_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_len: int) -> PackedBatch:
    """Packs a padded `[batch, seq]` micro-batch (left-padded prompts, right-padded responses, seq = prompt +
    response_len). Response token j of a row is predicted by the state at padded column seq - response_len - 1 + j;
    `response_index` locates those states in the packed row."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    cu_seq_lens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    packed_pos = (mask.cumsum(-1) - 1) + cu_seq_lens[:-1, None].long()  # [batch, seq]: packed index of each column
    width = input_ids.shape[-1]
    before = packed_pos[:, width - response_len - 1 : width - 1]
    valid = mask[:, width - response_len :]
    max_len = int(lengths.max())
    return PackedBatch(
        input_ids=input_ids[mask][None], position_ids=position_ids[mask][None],
        attention_kwargs=dict(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=max_len, max_length_k=max_len),
        response_index=before[valid], response_valid=valid,
    )


def unpack_responses(outputs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`[num_response_tokens, channels]` -> `[batch, response_len, channels]`, zero where there is no token."""
    # Written at integer positions, not through the boolean mask: the same values and gradients, and an index_copy's
    # shapes do not depend on data, so the memory rehearsal's fake tensors (rlcore.cli.rehearsal) can follow it.
    positions = valid.reshape(-1).nonzero().squeeze(1)
    out = outputs.new_zeros(valid.numel(), outputs.shape[-1]).index_copy(0, positions, outputs)
    return out.view(*valid.shape, outputs.shape[-1])
