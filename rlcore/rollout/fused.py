"""A decode-time forward for Llama-family models (Qwen2, Qwen3, Llama) with fewer, larger GEMMs.

A decode step is dozens of small ops per layer; on CPU each GEMM call and each HF module hop costs time the FLOPs
do not. Here each layer's q/k/v projections are one GEMM and gate/up one GEMM (vLLM does the same with
its QKVParallelLinear / MergedColumnParallelLinear), attention goes straight to the KV pool, and the norms,
rotary embedding, o/down projections, Qwen3's per-head q/k RMSNorms and head are the HF model's own modules, so
the maths is the model's.

The fused weights are the storage: the HF parameters become views into them, so `update_weights` (which copies
into the HF parameters) updates the fused GEMMs with no extra copy. Only for the engine's own model copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlcore.families import FAMILIES
from rlcore.rollout.kv_pool import SlotCache, pool_attention


def fusable(model: nn.Module) -> bool:
    """Whether the model's blocks are Llama's (its family says so: rlcore.families.<family>.FAMILY.fused_decode) with
    full attention and projections the fused GEMMs can stack."""
    c = model.config
    family = FAMILIES.get(c.model_type)
    return (family is not None and family.fused_decode and not getattr(c, "use_sliding_window", False) and getattr(c, "pretraining_tp", 1) == 1
            and all(_same_bias(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                    and _same_bias(layer.mlp.gate_proj, layer.mlp.up_proj) for layer in model.model.layers))


def _same_bias(*linears: nn.Linear) -> bool:
    return len({lin.bias is None for lin in linears}) == 1


def _fuse(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) holding the linears' rows; each linear's parameters become views into it."""
    fused = []
    for attr in ("weight", "bias"):
        if getattr(linears[0], attr) is None:
            fused.append(None)
            continue
        storage = torch.cat([getattr(lin, attr).data for lin in linears])
        offset = 0
        for lin in linears:
            param = getattr(lin, attr)
            param.data = storage[offset : offset + param.shape[0]]
            offset += param.shape[0]
        fused.append(storage)
    return fused[0], fused[1]


class FusedDecoder:
    """`decoder(ids, position_ids, mask, cache)` -> next-token logits `[rows, vocab]` of each row's last position."""

    def __init__(self, model: nn.Module) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.model, self.rotate = model, apply_rotary_pos_emb
        first = model.model.layers[0].self_attn
        self.head_dim = first.head_dim
        c = model.config
        self.splits = [c.num_attention_heads * self.head_dim, c.num_key_value_heads * self.head_dim, c.num_key_value_heads * self.head_dim]
        self.layers = [(layer, *_fuse(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                        *_fuse(layer.mlp.gate_proj, layer.mlp.up_proj)) for layer in model.model.layers]
        # LoRA without merging (rlcore.rollout.adapters): the stacked GEMMs' parts by HF module name, per layer
        self.adapters = None
        self.parts = [(tuple(f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"), (f"model.layers.{i}.mlp.gate_proj", f"model.layers.{i}.mlp.up_proj"))
                      for i in range(len(self.layers))]

    def __call__(self, ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        inner = self.model.model
        rows, length = ids.shape
        h = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(h, position_ids)
        for i, (layer, qkv_w, qkv_b, gate_up_w, gate_up_b) in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = (t.view(rows, length, -1, self.head_dim) for t in self._linear(x, qkv_w, qkv_b, self.parts[i][0]).split(self.splits, dim=-1))
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's dims, before the rotary embedding
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = self.rotate(q, k, cos, sin)
            k, v = cache.update(k, v, i)
            out, _ = pool_attention(attn, q, k, v, mask, scaling=attn.scaling)
            h = h + attn.o_proj(out.reshape(rows, length, -1))
            gate, up = self._linear(layer.post_attention_layernorm(h), gate_up_w, gate_up_b, self.parts[i][1]).chunk(2, dim=-1)
            h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        return self.model.lm_head(inner.norm(h[:, -1]))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: tuple[str, ...]) -> torch.Tensor:
        out = F.linear(x, weight, bias)
        delta = self.adapters.stacked_delta(parts, x) if self.adapters is not None else None
        return out if delta is None else out + delta
