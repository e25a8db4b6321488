"""Each family module's architecture facts (rlcore/families/arch.py) against what transformers builds and caches for
the same config: parameters, routed and active parameters, LoRA's targets, KV cache and recurrent state."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlcore.families import TINY_SHAPES, arch_of
from rlcore.plan.arch import BUILTIN, builtin_arch


def saved_config(model_type: str, kwargs: dict) -> tuple:
    """The config object, and the config.json save_pretrained writes for it (only what differs from the class
    defaults: Gemma's tied head, for one, is left out)."""
    config = AutoConfig.for_model(model_type, vocab_size=100, **kwargs)
    return config, json.loads(config.to_json_string(use_diff=True))


@pytest.fixture(scope="module")
def built():
    """Every tiny shape on the meta device (no memory), with the Arch its saved config.json gives."""
    out = {}
    for name, (model_type, kwargs) in TINY_SHAPES.items():
        config, saved = saved_config(model_type, kwargs)
        with torch.device("meta"):
            out[name] = (AutoModelForCausalLM.from_config(config), arch_of(saved, name))
    return out


@pytest.mark.parametrize("name", list(TINY_SHAPES))
def test_counts_equal_the_parameters_transformers_builds(name, built):
    model, arch = built[name]
    assert arch.params() == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert arch.routed_params() == experts
    assert arch.active_params() == arch.params() - experts * (arch.experts - arch.top_k) // max(arch.experts, 1)
    blocks = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    assert arch.blocks_params() == blocks and arch.root_params() == arch.params() - blocks
    linears = [m for n, m in model.named_modules() if ".layers." in n and isinstance(m, torch.nn.Linear)]
    assert arch.lora_params(8) == sum(8 * (m.in_features + m.out_features) for m in linears)  # peft's all-linear


@pytest.mark.parametrize("name", list(TINY_SHAPES))
def test_kv_cache_and_recurrent_state_are_what_the_cache_holds(name):
    """After a 20-token prefill: full-attention layers hold every token, sliding ones their window (HF keeps
    window - 1 tokens, vLLM the window: the plan takes vLLM's), MLA its latent, recurrent layers a fixed state
    (the plan takes vLLM's conv state of kernel - 1 steps, HF keeps kernel)."""
    model_type, kwargs = TINY_SHAPES[name]
    config, saved = saved_config(model_type, kwargs)
    torch.manual_seed(0)
    with torch.no_grad():
        cache = AutoModelForCausalLM.from_config(config).eval()(input_ids=torch.zeros(1, 20, dtype=torch.long), use_cache=True).past_key_values
    arch = arch_of(saved, name)
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers if getattr(layer, "keys", None) is not None)
    sliding = sum(b.count for b in arch.blocks if b.window)
    per_token = max((b.kv_heads * b.kv_dims for b in arch.blocks if b.window), default=0)
    attention_only = arch.kv_bytes(20, 1) - sum(b.count * b.state for b in arch.blocks)
    assert held <= attention_only <= held + sliding * per_token
    assert arch.kv_bytes(20, 1, windowed=False) >= attention_only
    for layer, block in ((layer, next(b for b in arch.blocks if b.state)) for layer in cache.layers if getattr(layer, "keys", None) is None):
        recurrent = layer.recurrent_states[0].numel()
        conv = layer.conv_states[0]
        assert block.state == recurrent + conv.shape[1] * (conv.shape[2] - 1)


def test_sliding_windows_mla_and_recurrent_layers_shrink_the_cache_of_long_sequences():
    """At 32K tokens: Gemma 2's sliding layers hold 4K tokens, GPT-OSS's 128; DeepSeek-V3 caches 576 latent channels
    per layer instead of 128 heads x 2 x 192 (its training forward expands them); bf16."""
    gemma, gpt_oss, deepseek = BUILTIN["gemma-2-9b"], BUILTIN["gpt-oss-20b"], BUILTIN["deepseek-v3"]
    tokens = 32768
    assert gemma.kv_bytes(tokens, 2) == 21 * 2 * 8 * 256 * 2 * (tokens + 4096)  # 21 global + 21 sliding layers
    assert gpt_oss.kv_bytes(tokens, 2) == 12 * 2 * 8 * 64 * 2 * (tokens + 128)
    assert deepseek.kv_bytes(tokens, 2) == 61 * 576 * 2 * tokens and deepseek.kv_bytes(tokens, 2, tp=8) == deepseek.kv_bytes(tokens, 2)
    assert deepseek.kv_heads == 128  # what the training forward's activations hold


@pytest.mark.parametrize("path, billions, active", [
    ("google/gemma-2-2b-it", 2.614, None), ("~/models/gemma-2-9b-it", 9.242, None), ("gemma-2-27b", 27.227, None),
    ("mistralai/Mistral-7B-Instruct-v0.3", 7.248, None), ("mistralai/Mistral-Nemo-Instruct-2407", 12.248, None),
    ("moonshotai/Moonlight-16B-A3B-Instruct", 15.96, 2.9), ("deepseek-ai/DeepSeek-V3", 671.0, 37.5),
    ("openai/gpt-oss-20b", 20.91, 3.6), ("openai/gpt-oss-120b", 116.83, 5.1), ("ByteDance-Seed/Seed-OSS-36B-Instruct", 36.15, None),
])
def test_the_newer_families_resolve_by_name_with_their_published_sizes(path, billions, active):
    """Model cards' totals (DeepSeek-V3: 671B without its next-token-prediction module; GPT-OSS counts active
    parameters without the input embedding)."""
    arch = builtin_arch(path)
    assert arch is not None and arch.params() / 1e9 == pytest.approx(billions, rel=0.005), path
    if active:
        embedding = arch.vocab * arch.hidden if arch.model_type == "gpt_oss" else 0
        assert (arch.active_params() - embedding) / 1e9 == pytest.approx(active, rel=0.03), path
