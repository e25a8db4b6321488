"""The family registry (rlcore/families/__init__.py): one module per family, what the generic path takes, and every
refusal naming what to use instead."""

import pkgutil

import pytest

import rlcore.families
from rlcore.families import FAMILIES, TINY_SHAPES, family_of, family_problems, is_moe, num_experts
from rlcore.families.base import Family


def test_every_family_module_is_registered_with_a_tiny_shape():
    modules = {m.name for m in pkgutil.iter_modules(rlcore.families.__path__)}
    families = {name for name in modules if isinstance(getattr(__import__(f"rlcore.families.{name}", fromlist=["FAMILY"]), "FAMILY", None), Family)}
    assert families == set(FAMILIES)  # a module with a FAMILY that the registry misses would never be read
    assert all(f.tiny for f in FAMILIES.values()) and {t[0] for t in TINY_SHAPES.values()} == set(FAMILIES)
    assert all(f.router is not None for f in FAMILIES.values() if f.model_type.endswith("moe") or f.model_type in ("deepseek_v3", "gpt_oss"))


def test_a_model_type_without_a_module_takes_the_generic_path_on_fsdp2_and_is_refused_on_megatron():
    olmo2 = {"model_type": "olmo2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
             "vocab_size": 100}
    assert family_of(olmo2) is None and family_problems(olmo2, "fsdp2", rollout="vllm") == []
    assert "no megatron-core build in rlcore" in family_problems(olmo2, "megatron")[0]
    mixtral = {"model_type": "mixtral", "num_local_experts": 8}  # a MoE without a module: no router facts, FSDP2 runs it
    assert family_problems(mixtral, "fsdp2") == [] and is_moe(mixtral) and num_experts(mixtral) == 8
    qwen_vl = {"model_type": "qwen2_5_vl", "vision_config": {}, "text_config": {"model_type": "qwen2_5_vl_text"}}
    assert family_problems(qwen_vl, "fsdp2", "native") == family_problems(qwen_vl, "fsdp2", "vllm") == []  # both run its tower


@pytest.mark.parametrize("config, strategy, rollout, message", [
    ({"model_type": "vit"}, "fsdp2", None, "not a causal LM transformers ships"),
    ({"model_type": "my_lab_model"}, "fsdp2", None, "upgrade transformers or use a checkpoint of a family it has"),
    ({"model_type": "llava", "vision_config": {}, "text_config": {"model_type": "llama"}}, "fsdp2", None,
     "is a vision-language model rlcore has no module for"),
    ({"model_type": "qwen3_vl", "vision_config": {}, "text_config": {"model_type": "qwen3_vl_text"}}, "megatron", "vllm",
     "megatron-core 0.16 has no Qwen-VL vision tower"),
    ({"model_type": "gemma2"}, "megatron", None, "no post-attention / post-MLP norms, no logit soft-capping"),
    ({"model_type": "deepseek_v3", "rope_scaling": {"rope_type": "dynamic", "factor": 4}}, "megatron", None,
     "rope_type=dynamic: megatron-core's MLA takes plain RoPE or YaRN"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 6, "n_group": 2, "topk_group": 1}, "megatron", None,
     "megatron-core scores an expert group by its top 6 experts where transformers uses 2"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": False}, "megatron", None,
     "megatron-core's sigmoid router always renormalises its top-k"),
    ({"model_type": "qwen3_5_text", "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}, "fsdp2", "native",
     "linear_attention layers, whose recurrent state the native engine's KV pool cannot hold; use actor_rollout_ref.rollout.name=vllm"),
    ({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}, "megatron", None,
     "use strategy=fsdp2 (or sliding_window=null"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "megatron", None, "use_sliding_window=false in config.json"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "mlp_only_layers": [0]}, "fsdp2", None, "set mlp_only_layers=[] and decoder_sparse_step=1"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 8, "topk_method": "greedy"}, "fsdp2", None, "routes by noaux_tc only"),
])
def test_refusals_name_the_alternative(config, strategy, rollout, message):
    problems = family_problems(config, strategy, rollout)
    assert len(problems) == 1 and message in problems[0], problems


def test_what_runs_now_was_refused_before_and_is_not_anymore():
    """Sliding windows (packed training and the native engine honour them) and the newer families on FSDP2."""
    assert family_problems({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096}, "fsdp2", "native") == []
    for model_type in ("gemma2", "gemma3_text", "mistral", "deepseek_v3", "gpt_oss", "glm4_moe", "seed_oss"):
        assert family_problems({"model_type": model_type}, "fsdp2", "native") == [], model_type
    # DeepSeek-V3 on megatron-core's latent attention and biased sigmoid router, over TP ranks too
    assert family_problems({"model_type": "deepseek_v3", "num_attention_heads": 16}, "megatron", tensor_parallel=8) == []
    assert "needs at least two of its 16 heads per TP rank" in family_problems({"model_type": "deepseek_v3", "num_attention_heads": 16},
                                                                              "megatron", tensor_parallel=16)[0]
