"""What Qwen's two mixtures of experts share: every layer routes (HF's Qwen MoE allows dense layers among them,
which no published Qwen MoE has), and the refusals that follow from it."""

from rlcore.families.arch import arch, attention_blocks, gqa_linears, moe_block, routed_experts, swiglu, text_config
from rlcore.families.base import Router

ROUTER = Router(module="mlp.gate", scoring="softmax")


def qwen_moe_arch(config, name, attention_other: int, shared_width: int):
    c = text_config(config)
    h = c["hidden_size"]
    shared = swiglu(h, shared_width) + ((h, 1),) if shared_width else ()  # Qwen2-MoE: a shared expert and its sigmoid gate
    template = attention_blocks(c, gqa_linears(c), attention_other + 2 * h)
    blocks = [moe_block(c, b.count, b.linears, b.other, shared=shared, kv_heads=b.kv_heads, kv_dims=b.kv_dims, window=b.window)
              for b in template]
    return arch(config, name, blocks, c["num_experts_per_tok"] * c["moe_intermediate_size"] + shared_width)


def qwen_moe_problems(config, strategy):
    c = text_config(config)
    problems = []
    if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
        problems.append(f"{c.get('model_type')} with dense layers among the MoE ones (mlp_only_layers={c.get('mlp_only_layers')}, "
                        f"decoder_sparse_step={c.get('decoder_sparse_step')}): rlcore's router bookkeeping for Qwen MoE assumes every "
                        "layer routes, as in every published Qwen MoE; set mlp_only_layers=[] and decoder_sparse_step=1")
    if routed_experts(c) > 32767:
        problems.append(f"{c.get('model_type')} with {routed_experts(c)} experts: routes are carried as int16")
    return problems
