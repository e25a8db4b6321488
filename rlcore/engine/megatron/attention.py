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


def sum_latent_key_gradient_over_tp() -> None:
    """megatron-core 0.16.1's multi-head latent attention on local modules (the only build rlcore makes) computes the
    RoPE key all heads share from the TP-split latent projection's gathered output, so every TP rank holds all of it
    and uses it for its own heads: the key's gradient on each rank is that rank's heads' share, and the gather's
    backward keeps one rank's share of its columns (measured: the grad norm 2e-5 off HF's at TP2, log-probs exact).
    Here the shared key passes through `copy_to_tensor_model_parallel_region` (identity forward, all-reduce over TP in
    backward) before it is rotated, so its gradient is every head's. The key is the rotation input with one head
    (`[.., 1, rope]`); family_problems keeps at least two heads per rank so a query never looks like it. Idempotent."""
    from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region
    from megatron.core.transformer import multi_latent_attention

    rotate = multi_latent_attention.apply_rotary_pos_emb
    if getattr(rotate, "sums_latent_key", False):
        return

    def apply_rotary_pos_emb(t, freqs, config, *args, **kwargs):
        if t.shape[-2] == 1 and config.tensor_model_parallel_size > 1 and t.requires_grad:
            t = copy_to_tensor_model_parallel_region(t)
        return rotate(t, freqs, config, *args, **kwargs)

    apply_rotary_pos_emb.sums_latent_key = True
    multi_latent_attention.apply_rotary_pos_emb = apply_rotary_pos_emb
