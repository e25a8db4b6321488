"""Shared fixtures: a real (tiny) HF model + tokenizer saved to a local directory, and the tiny task data."""

from __future__ import annotations

import pytest
import torch


def build_tiny_model_dir(path: str, seed: int = 0, layers: int = 2, hidden: int = 64, max_position_embeddings: int = 64) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_llama_dir(path: str, seed: int = 1, layers: int = 4, hidden: int = 64, heads: int = 8) -> str:
    """A tiny Llama: tied embeddings, no attention bias, 4 query heads per KV head, and an odd vocabulary (one more
    than the tokenizer's), so tensor parallelism has to pad it. vLLM's CPU attention needs head_dim >= 32
    (hidden=128, heads=4)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlcore.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 1 if len(tokenizer) % 2 == 0 else len(tokenizer), hidden_size=hidden, intermediate_size=96,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 4, max_position_embeddings=64, rope_theta=5e5,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` run vLLM for real; where it is not importable (the main venv) they are skipped, not faked."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here: `make test-vllm` runs these in .cache/vllm_venv")
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_task_dir(tmp_path_factory) -> str:
    from rlcore.data.synthetic import write_task

    out = str(tmp_path_factory.mktemp("tiny_task"))
    write_task(out, num_train=512, num_test=64, min_digits=1, max_digits=2, seed=0)
    return out


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory) -> str:
    """The demo's own assets (task data + SFT warm-start that stops at 25% train-pool accuracy), built once."""
    from rlcore.cli.prepare_tiny import prepare

    out = tmp_path_factory.mktemp("demo_assets")
    prepare(str(out))
    return str(out)


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """A test that initialises a process group in-process must destroy it; the next test starts clean."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
