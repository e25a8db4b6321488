"""use_remove_padding in the FSDP2 engine: packed micro-batches give the padded path's log-probs, entropies,
values and gradients (1 gloo rank; the 2-rank case is in tests/workers/test_dynamic_bsz.py), for a mixture of experts
too, whose log-probs both ways equal HF's own forward."""

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch, token_outputs

from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob
from rlcore.workers.critic import compute_values

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)


def engines(model_dir, kind="causal_lm", gradient_checkpointing=False):
    """(padded, packed) engines with the same weights."""
    init_gloo(0, 1, free_port())  # torn down by conftest
    out = []
    for packed in (False, True):
        torch.manual_seed(0)  # the value head is initialised: the same init for both
        spec = EngineSpec(model_path=model_dir, kind=kind, use_remove_padding=packed, lr=1e-3, gradient_checkpointing=gradient_checkpointing)
        out.append(FSDP2Engine(spec, torch.device("cpu")))
    return out


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import build_model_dir

    return build_model_dir(str(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe"), "tiny-qwen3-moe", build_char_tokenizer())


@pytest.fixture
def data():
    return DataProto.from_dict(make_rollout_batch(8, 7, 9, 60, seed=11))


def test_packed_log_probs_and_entropy_equal_padded(tiny_model_dir, data):
    padded, packed = engines(tiny_model_dir)
    a = compute_log_prob(padded, data, MicroBatchSpec(rows=3), temperature=0.7, with_entropy=True)
    b = compute_log_prob(packed, data, MicroBatchSpec(rows=3, packed=True), temperature=0.7, with_entropy=True)
    mask = data.batch["response_mask"].bool()
    for key in ("log_probs", "entropys"):
        torch.testing.assert_close(b.batch[key][mask], a.batch[key][mask], atol=1e-5, rtol=1e-5)


def test_packed_values_equal_padded(tiny_model_dir, data):
    padded, packed = engines(tiny_model_dir, kind="value")
    a = compute_values(padded, data, MicroBatchSpec(rows=8)).batch["values"]
    b = compute_values(packed, data, MicroBatchSpec(rows=8, packed=True)).batch["values"]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_a_mixture_of_experts_packed_and_padded_gives_hfs_own_log_probs(moe_dir, data):
    from rlcore.models.hf import load_causal_lm

    b = data.batch
    logits = load_causal_lm(moe_dir)(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    hf = token_outputs(logits[:, -b["responses"].shape[1] - 1 : -1], b["responses"])["log_probs"]
    mask = b["response_mask"].bool()
    for engine, packed in zip(engines(moe_dir), (False, True)):
        out = compute_log_prob(engine, data, MicroBatchSpec(rows=3, packed=packed), temperature=1.0, with_entropy=False)
        torch.testing.assert_close(out.batch["log_probs"][mask], hf[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("model, gradient_checkpointing", [("dense", False), ("dense", True), ("moe", True)])
def test_packed_gradients_equal_padded(tiny_model_dir, moe_dir, data, model, gradient_checkpointing):
    def nll(outputs, mb):
        mask = mb.batch["response_mask"]
        return -(outputs["log_probs"] * mask).sum() / mask.sum(), {}

    grads = []
    for engine in engines(moe_dir if model == "moe" else tiny_model_dir, gradient_checkpointing=gradient_checkpointing):
        engine.forward_backward([data], nll)
        grads.append([p.grad.full_tensor().clone() for p in engine.model.parameters()])
    for g_packed, g_padded in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_packed, g_padded, atol=1e-6, rtol=1e-4)
