"""LoRA adapters applied by the native engine over its base (rlcore/rollout/adapters.py, model.lora.merge=False):
greedy tokens and log-probs equal HF + peft's forward with the same adapter, on the fused decoder and on HF's own
modules or merged into the weights, after in-place reloads of changed adapters, and with two named adapters held over
one base (multi-LoRA), switched per call."""

import pytest
import torch
from conftest import build_tiny_llama_dir

from rlcore.models import lora
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout

pytestmark = pytest.mark.numerics
IDS = torch.tensor([[0, 0, 7, 8, 9], [10, 11, 12, 13, 14], [0, 20, 21, 22, 23]])
MASK = (IDS != 0).long()
TOKENS = 6


def peft_model(model_dir: str, seed: int):
    """HF + peft with every linear adapted (rank 8) and B drawn at random (peft starts it at zero)."""
    import peft
    from transformers import AutoModelForCausalLM

    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    redraw(model, seed)
    return model.eval()


def redraw(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if ".lora_B." in name:
            param.data.normal_(0, 0.2, generator=g)


def adapters_of(model, name: str = "default") -> lora.Adapters:
    named = [(n, t) for n, t in model.state_dict().items() if lora.is_factor(n)]
    out = lora.adapters_of(named, lora.scalings(model), 8)
    out.name = name
    return out


def check_against(model, rollout, adapter: str | None = None) -> None:
    """Greedy tokens equal HF + peft's and log-probs within 1e-5 (any rollout engine: test_vllm_lora.py too)."""
    out = rollout.generate(IDS, MASK, SamplingParams(max_tokens=TOKENS, do_sample=False, adapter=adapter))
    with torch.no_grad():
        expected = model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=TOKENS, do_sample=False, pad_token_id=0,
                                  eos_token_id=None)[:, IDS.shape[1]:]
        seq = assemble_sequences(IDS, MASK, out)
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    assert torch.equal(out.responses, expected)
    torch.testing.assert_close(out.response_log_probs, gather_log_probs(response_logits(logits, TOKENS, 1.0), out.responses),
                               atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_llama_dir(str(tmp_path_factory.mktemp("llama")), layers=2, hidden=128, heads=4)


@pytest.mark.parametrize("how", ["fused", "hf_modules", "merged_in"])
def test_the_rollout_applies_the_adapters_and_follows_reloads(model_dir, how):
    """fused: the fused decoder's stacked deltas; hf_modules: forward hooks; merged_in (merge_adapters): merged into
    the weights from a kept copy of the base, so a reload merges the new factors into the base, not the last merge."""
    model = peft_model(model_dir, seed=0)
    rollout = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), merge_adapters=how == "merged_in")
    if how == "hf_modules":
        rollout.decoder = None  # HF's modules, the adapters through forward hooks
    rollout.update_weights(lora.base_weights(model.state_dict().items()))
    rollout.load_adapters(adapters_of(model))
    check_against(model, rollout)
    held = rollout.adapters.held["default"]["model.layers.0.self_attn.q_proj"][1]
    redraw(model, seed=1)
    rollout.load_adapters(adapters_of(model))
    assert rollout.adapters.held["default"]["model.layers.0.self_attn.q_proj"][1] is held  # copied in place
    check_against(model, rollout)


@pytest.mark.parametrize("merge", [False, True])
def test_two_named_adapters_over_one_base(model_dir, merge):
    """Multi-LoRA, per call: each generate() names the adapter it uses; the policy's ("default") when none is named
    (merged in: switching re-merges from the base)."""
    policy, other = peft_model(model_dir, seed=0), peft_model(model_dir, seed=5)
    rollout = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), merge_adapters=merge)
    rollout.update_weights(lora.base_weights(policy.state_dict().items()))
    rollout.load_adapters(adapters_of(policy))
    rollout.load_adapters(adapters_of(other, "other"))
    check_against(other, rollout, adapter="other")
    check_against(policy, rollout)
    with pytest.raises(KeyError, match="no LoRA adapter named 'third'"):
        rollout.generate(IDS, MASK, SamplingParams(max_tokens=2, do_sample=False, adapter="third"))
