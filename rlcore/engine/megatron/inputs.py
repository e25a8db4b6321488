"""A micro-batch in megatron-core's layout: token ids for GPTModel, which final states reach the head, and how the
head's output maps back to `[batch, response_len]`.

megatron-core's RoPE numbers positions 0..s-1 along each row (it ignores position_ids), while rlcore's rows are
left-padded prompts + right-padded responses. Padded micro-batches are therefore left-aligned (each row's real
tokens moved to its start, padding only on the right, where causal attention never looks); packed micro-batches
(use_remove_padding) restart positions per sequence through PackedSeqParams (THD), as HF's varlen path does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from rlcore.models.varlen import pack_sequences, unpack_responses
from rlcore.protocol import DataProto


@dataclass
class ModelInputs:
    input_ids: torch.Tensor               # [b, s] left-aligned, or [1, t] packed
    position_ids: torch.Tensor            # same shape (used by megatron only for learned positions; RoPE here)
    packed_seq_params: PackedSeqParams | None
    state_index: torch.Tensor             # padded: [R, b] column of the state before each response token; packed: [n]
    head_tokens: torch.Tensor             # the tokens those states predict: [R, b] or [n, 1]
    response_valid: torch.Tensor | None   # packed: [b, R] which (row, token) the n states belong to
    token_order: torch.Tensor | None = None  # padded: [b, s] the original column of each left-aligned one (router replay)

    def select(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states `[s, b, h]` -> the states before response tokens: `[R, b, h]` or `[n, 1, h]`."""
        if self.response_valid is not None:
            return hidden[self.state_index]
        return hidden[self.state_index, torch.arange(hidden.shape[1], device=hidden.device)]

    def unpack(self, output: torch.Tensor) -> torch.Tensor:
        """GPTModel's output of the head (`[b, R, C]` or `[1, n, C]`) -> `[b, R, C]`, zero where there is no token."""
        return output if self.response_valid is None else unpack_responses(output[0], self.response_valid)


def model_inputs(mb: DataProto, packed: bool, device: torch.device, seq_multiple: int = 1) -> ModelInputs:
    """`seq_multiple`: sequence parallelism splits the sequence over the TP ranks, so its length is padded to a
    multiple of TP: padded rows get more right padding, a packed row a padding sequence of its own at the end."""
    b = mb.batch
    input_ids, mask, responses = b["input_ids"].to(device), b["attention_mask"].to(device), b["responses"].to(device)
    response_len = responses.shape[-1]
    if packed:
        p = pack_sequences(input_ids, mask, b["position_ids"].to(device), response_len)
        ids, positions = p.input_ids, p.position_ids
        cu, max_len = p.attention_kwargs["cu_seq_lens_q"], p.attention_kwargs["max_length_q"]
        pad = -ids.shape[1] % seq_multiple
        if pad:
            ids = torch.cat([ids, ids.new_zeros(1, pad)], 1)
            positions = torch.cat([positions, torch.arange(pad, device=device)[None]], 1)
            cu = torch.cat([cu, cu.new_tensor([ids.shape[1]])])
            max_len = max(max_len, pad)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max_len, max_seqlen_kv=max_len)
        return ModelInputs(ids, positions, params, p.response_index, responses[p.response_valid][:, None], p.response_valid)
    real = mask.bool()
    prompt_len = real[:, : input_ids.shape[1] - response_len].sum(-1)
    width = int(real.sum(-1).max())
    width += -width % seq_multiple
    if width > input_ids.shape[1]:
        input_ids, real = (torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (input_ids, real))
    # Real tokens first, in order (a stable sort of "is padding"), then cut to the longest row.
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)
    aligned = input_ids.gather(1, order)[:, :width]
    positions = torch.arange(width, device=device).expand_as(aligned)
    # Response token j of a row sits at column prompt_len + j after alignment; the state before it at one less.
    index = (prompt_len[:, None] + torch.arange(response_len, device=device) - 1).clamp(0, width - 1)
    return ModelInputs(aligned, positions, None, index.t(), responses.t(), None, order[:, :width])
