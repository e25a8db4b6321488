"""The CPU shim for megatron-core stays inside megatron-core: its modules see CPU devices and CPU RNG states, the
rest of the process keeps the real torch."""

import pytest
import torch

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def shim():
    from rlcore.engine.megatron import cpu_shim

    cpu_shim.apply_cpu_shim()
    return cpu_shim


def test_megatron_modules_see_the_cpu_and_the_rest_of_torch_is_untouched(shim):
    from megatron.core.optimizer import clip_grads
    from megatron.core.tensor_parallel import layers

    assert layers.torch.cuda.current_device() == torch.device("cpu")
    assert clip_grads.torch.zeros(2, device="cuda").device.type == "cpu"
    assert clip_grads.torch.tensor([1.0], device=layers.torch.cuda.current_device()).device.type == "cpu"
    assert layers.torch.Tensor is torch.Tensor and layers.torch.distributed is torch.distributed
    assert not torch.cuda.is_available() and torch.zeros(1).device.type == "cpu"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")  # outside megatron-core, CUDA is still absent, not faked


def test_cuda_type_names_only_inside_the_context(shim):
    assert torch.zeros(1).type() == "torch.FloatTensor"
    with shim.cuda_type_names():
        assert torch.zeros(1).type() == "torch.cuda.FloatTensor" and torch.zeros(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert torch.zeros(1).type(torch.float64).dtype == torch.float64  # conversions still convert
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_rng_tracker_forks_the_cpu_generator_and_restores_it(shim):
    from megatron.core.tensor_parallel import random

    tracker = random.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 123)
    torch.manual_seed(0)
    with tracker.fork("model-parallel-rng"):
        forked = torch.rand(3)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))  # the default stream continued as if the fork never happened
    torch.manual_seed(123)
    assert torch.equal(forked, torch.rand(3))  # inside the fork: the tracker's own seeded stream
