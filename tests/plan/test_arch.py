"""Architectures for the memory plan: the built-in table against published sizes, names, config.json."""

import json

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from rlcore.plan.arch import BUILTIN, arch_from_hf_config, builtin_arch, hf_config, resolve_arch


@pytest.mark.parametrize("name, billions", [
    ("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-3b", 3.086), ("qwen2.5-7b", 7.616),
    ("qwen2.5-14b", 14.770), ("qwen2.5-32b", 32.764), ("qwen2.5-72b", 72.706),
    ("llama3-8b", 8.030), ("llama3-70b", 70.554), ("deepseek-llm-7b", 6.911),
])
def test_builtin_parameter_counts_match_the_published_models(name, billions):
    assert BUILTIN[name].params() / 1e9 == pytest.approx(billions, abs=0.002)


@pytest.mark.parametrize("path, name", [
    ("Qwen/Qwen2-7B-Instruct", "qwen2.5-7b"), ("~/models/Qwen2.5-32B-Instruct", "qwen2.5-32b"),
    ("/data/Qwen2-72B", "qwen2.5-72b"), ("Meta-Llama-3.1-70B-Instruct", "llama3.1-70b"),
    ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b"), ("Qwen/Qwen3-4B", "qwen3-4b"), ("~/models/Qwen3-0.6B-Base", "qwen3-0.6b"),
    ("~/models/Meta-Llama-3-8B-Instruct/", "llama3-8b"), ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-llm-7b"),
])
def test_names_resolve_to_the_table(path, name):
    assert builtin_arch(path).name == name


@pytest.mark.parametrize("path", ["Qwen2-3B", "gpt2", "~/models/my-model", "FsfairX-LLaMA3-RM-v0.1"])
def test_unknown_names_do_not_guess(path):
    assert builtin_arch(path) is None
    arch, why = resolve_arch(path)
    assert arch is None and "no config.json" in why and "qwen2.5-7b" in why


def test_config_json_wins_and_counts_exactly(tiny_model_dir):
    arch, source = resolve_arch(tiny_model_dir)
    assert source.endswith("config.json")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    assert arch.params() == sum(p.numel() for p in model.parameters())


def test_hf_config_of_a_real_qwen2_shape_matches_the_table(tmp_path):
    config = AutoConfig.for_model("qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                  num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
                                  tie_word_embeddings=False, max_position_embeddings=32768)
    config.save_pretrained(tmp_path)
    arch = arch_from_hf_config(json.loads((tmp_path / "config.json").read_text()), "qwen2-7b")
    assert arch.params() == BUILTIN["qwen2.5-7b"].params() and arch.model_type == "qwen2"
    assert arch.kv_bytes_per_token(2, tp=2) == 2 * 28 * 2 * 128 * 2  # K and V, 28 layers, 2 of 4 KV heads, bf16


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b",
                                  "qwen3-30b-a3b", "qwen1.5-moe-a2.7b"])
def test_builtin_counts_equal_the_hf_model_of_the_same_shape(name):
    """The table's count is what HF builds for that config (meta device: no memory): q/k norms, explicit head_dim,
    tied heads, routed and shared experts included; a MoE token's active parameters are all but its idle experts'."""
    import torch

    a = BUILTIN[name]
    config = dict(hf_config(a), head_dim=a.dim)
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert a.params() == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert a.active_params() == a.params() - experts * (a.experts - a.top_k) // max(a.experts, 1)


def test_moe_checkpoints_resolve_by_name_with_their_published_sizes():
    """30.5B with 3.3B active (Qwen3-30B-A3B's model card), 14.3B with 2.7B active (Qwen1.5-MoE-A2.7B's)."""
    for path, total, active in [("Qwen/Qwen3-30B-A3B-Instruct-2507", 30.5, 3.3), ("~/models/Qwen1.5-MoE-A2.7B-Chat", 14.3, 2.7),
                                ("Qwen3-235B-A22B", 235.1, 22.2), ("Qwen2-57B-A14B", 57.4, 14.2)]:
        arch = builtin_arch(path)
        # model cards round (3.35B active reads "3.3B"): within 2%
        assert (arch.params() / 1e9, arch.active_params() / 1e9) == pytest.approx((total, active), rel=0.02), path


def test_config_json_of_every_tiny_family_counts_exactly(tmp_path):
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import TINY_FAMILIES, build_model_dir

    for family in TINY_FAMILIES:
        path = build_model_dir(str(tmp_path / family), family, build_char_tokenizer())
        arch, _ = resolve_arch(path)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        assert arch.params() == sum(p.numel() for p in model.parameters()), family
