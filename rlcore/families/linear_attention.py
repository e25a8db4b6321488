"""What Qwen3.5 and Qwen3-Next share: linear-attention layers (Gated DeltaNet: a causal conv over q/k/v, then a
recurrent state updated per token) among gated full-attention layers (q_proj also computes an output gate)."""

from rlcore.families.arch import Block, gqa_linears, head_dim, kv_head_count, layer_kinds

LINEAR = "linear_attention"


def linear_layers(c) -> int:
    return sum(kind == LINEAR for kind in layer_kinds(c))


def gated_deltanet(c, fused_qkvz: bool) -> tuple[tuple, int, int]:
    """(linears, other parameters, state elements per sequence) of one linear-attention layer. Qwen3-Next projects
    q/k/v/z in one matrix and b/a in another; Qwen3.5 has one each."""
    h, nk, nv = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, kernel = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    key, value = nk * dk, nv * dv
    conv = 2 * key + value
    if fused_qkvz:
        linears = ((h, conv + value), (h, 2 * nv))
    else:
        linears = ((h, conv), (h, value), (h, nv), (h, nv))
    other = conv * kernel + 2 * nv + dv  # the conv kernel, dt_bias and A_log, the gated norm
    return linears + ((value, h),), other, conv * (kernel - 1) + nv * dk * dv


def hybrid_blocks(c, mlp: tuple, mlp_other: int, fused_qkvz: bool, **routed) -> list[Block]:
    """Full-attention blocks (gated q, q/k RMSNorm) and linear-attention blocks, each followed by the MLP."""
    h, d = c["hidden_size"], head_dim(c)
    linear = linear_layers(c)
    bias = ((c["num_attention_heads"] * 2 + 2 * kv_head_count(c)) * d + h) if c.get("attention_bias") else 0
    full = Block(len(layer_kinds(c)) - linear, gqa_linears(c, q_factor=2) + mlp, bias + 2 * d + 2 * h + mlp_other,
                 kv_heads=kv_head_count(c), kv_dims=2 * d, **routed)
    linears, other, state = gated_deltanet(c, fused_qkvz)
    return [b for b in (full, Block(linear, linears + mlp, other + 2 * h + mlp_other, state=state, **routed)) if b.count]
