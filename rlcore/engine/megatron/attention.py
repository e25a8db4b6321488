"""megatron-core's core-attention slot on torch SDPA, for padded rows and packed (THD) sequences alike.

megatron-core's own local `DotProductAttention` refuses packed sequences and its fused alternatives need
Transformer Engine (CUDA). This module needs neither: padded rows go to SDPA (flash / memory-efficient kernels on
CUDA), packed ones to rlcore.models.varlen.packed_causal_attention (varlen flash kernels on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

from rlcore.models.varlen import packed_causal_attention


class SDPACoreAttention(MegatronModule):
    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str, attention_dropout: float | None = None,
                 softmax_scale: float | None = None, cp_comm_type: str | None = None, pg_collection=None, **unused) -> None:
        super().__init__(config=config)
        self.softmax_scale = softmax_scale  # None: 1/sqrt(head_dim), as HF
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None) -> torch.Tensor:
        """Padded: query `[s, b, heads, dim]`, key/value `[s, b, kv_heads, dim]` -> `[s, b, heads * dim]`. The engine
        left-aligns every row (padding only on the right), so plain causal masking keeps real tokens off the
        padding and no mask tensor is needed. Packed: `[t, heads, dim]` -> `[t, heads * dim]`, causal per sequence."""
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is not None:
            q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [heads, t, dim]
            out = packed_causal_attention(q, k, v, packed_seq_params.cu_seqlens_q, packed_seq_params.max_seqlen_q, self.softmax_scale, dropout)
            return out.reshape(out.shape[0], -1)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, dim]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, dropout_p=dropout,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)
