"""use_remove_padding in the FSDP2 engine: packed micro-batches give the padded path's log-probs, entropies,
values and gradients (1 gloo rank; the 2-rank case is in tests/workers/test_dynamic_bsz.py)."""

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch

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


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_packed_gradients_equal_padded(tiny_model_dir, data, gradient_checkpointing):
    def nll(outputs, mb):
        mask = mb.batch["response_mask"]
        return -(outputs["log_probs"] * mask).sum() / mask.sum(), {}

    grads = []
    for engine in engines(tiny_model_dir, gradient_checkpointing=gradient_checkpointing):
        engine.forward_backward([data], nll)
        grads.append([p.grad.full_tensor().clone() for p in engine.model.parameters()])
    for g_packed, g_padded in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_packed, g_padded, atol=1e-6, rtol=1e-4)
