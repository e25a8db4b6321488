"""vLLM cannot run on a CPU-only machine; what is testable here is that choosing it fails clearly."""

import importlib.util

import pytest
import torch

from rlcore.rollout.factory import build_rollout


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: the missing-extra path does not apply")
def test_missing_vllm_says_what_to_install(tiny_model_dir):
    with pytest.raises(ImportError, match=r"pip install 'rlcore\[vllm\]'.*rollout.name=native"):
        build_rollout("vllm", model_path=tiny_model_dir, pad_token_id=0, device=torch.device("cpu"))


def test_unknown_rollout_name_lists_choices():
    with pytest.raises(ValueError, match="native or vllm"):
        build_rollout("sglang")
