"""LoRA adapters into vLLM from memory (rlcore/rollout/vllm_lora.py, model.lora.merge=False), on vLLM's CPU build:
the base loaded once by a sync, the adapters by `load_adapters`; greedy tokens equal HF + peft's and log-probs within
1e-5 in fp32, after in-place reloads of changed adapters, and with two named adapters over one base (multi-LoRA)."""

import pytest
import torch
from conftest import build_tiny_llama_dir
from test_adapters import adapters_of, check_against, peft_model, redraw

from rlcore.models import lora
from rlcore.rollout.factory import build_rollout

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """A lone vLLM engine owns a world-1 process group for the module's life (as in test_vllm.py)."""
    yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = build_tiny_llama_dir(str(tmp_path_factory.mktemp("llama")), layers=2, hidden=128, heads=4)
    rollout = build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=torch.device("cpu"), dtype="float32", seed=0,
                            max_model_len=64, max_num_seqs=8, enforce_eager=True, lora_rank=8, engine_kwargs={"max_loras": 2})
    return model_dir, rollout


def test_vllm_applies_adapters_from_memory_across_syncs(setup):
    model_dir, rollout = setup
    model = peft_model(model_dir, seed=0)
    rollout.wake_up(["weights"])
    rollout.update_weights(lora.base_weights(model.state_dict().items()))
    for seed in (0, 1, 2):  # three syncs of changed adapters, each replacing the last under the same id
        redraw(model, seed)
        rollout.wake_up(["weights"])
        rollout.load_adapters(adapters_of(model))
        rollout.wake_up(["kv_cache"])  # drops cached prefixes computed under the previous adapter
        check_against(model, rollout)


def test_vllm_holds_two_named_adapters_over_one_base(setup):
    model_dir, rollout = setup
    policy, other = peft_model(model_dir, seed=3), peft_model(model_dir, seed=4)
    rollout.update_weights(lora.base_weights(policy.state_dict().items()))
    rollout.load_adapters(adapters_of(policy))
    rollout.load_adapters(adapters_of(other, "other"))
    rollout.wake_up(["kv_cache"])
    check_against(other, rollout, adapter="other")
    check_against(policy, rollout)


def test_vllm_refuses_an_adapter_on_a_module_it_has_no_lora_layer_for(setup):
    """vLLM's LoRAModel built from tensors would drop such a module silently: the rollout would not be the policy."""
    model_dir, rollout = setup
    adapters = adapters_of(peft_model(model_dir, seed=0))
    a, b = adapters.pair("model.layers.0.mlp.down_proj")
    adapters.tensors.update({"model.layers.0.mlp.act_proj.lora_A.weight": a, "model.layers.0.mlp.act_proj.lora_B.weight": b})
    with pytest.raises(ValueError, match=r"vLLM has no LoRA layer for \['act_proj'\]"):
        rollout.load_adapters(adapters)
