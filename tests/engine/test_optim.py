"""rlcore.engine.optim: the lr schedules are tested with the engines (tests/engine/test_fsdp2.py); here the FSDP2
engine's AdamW kernel: foreach on CPU, fused on CUDA, an override's own choice kept, the same update either way."""

import pytest
import torch
from dist_utils import free_port, init_gloo

from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.engine.optim import adamw_kernel


def test_the_kernel_by_device_unless_the_override_names_one():
    assert adamw_kernel("cuda", {}) == {"fused": True} and adamw_kernel("cpu", {}) == {"foreach": True}
    assert adamw_kernel("cuda", {"foreach": True}) == {} and adamw_kernel("cpu", {"fused": False, "eps": 1e-6}) == {}


@pytest.mark.numerics
def test_foreach_takes_the_per_parameter_loops_step(tiny_model_dir):
    init_gloo(0, 1, free_port())
    engines = [FSDP2Engine(EngineSpec(model_path=tiny_model_dir, lr=1e-2, optimizer_overrides=o), torch.device("cpu"))
               for o in ({}, {"foreach": False})]
    assert [e.optimizer.param_groups[0]["foreach"] for e in engines] == [True, False]
    grads = [torch.randn_like(p.full_tensor(), generator=torch.Generator().manual_seed(i)) for i, p in enumerate(engines[0].trained)]
    for _ in range(3):  # the moments as well as the weights
        for engine in engines:
            for p, g in zip(engine.trained, grads):
                p.grad = torch.distributed.tensor.distribute_tensor(g, p.device_mesh, p.placements)
            engine.optimizer_step()
    for a, b in zip(engines[0].trained, engines[1].trained):
        torch.testing.assert_close(a.full_tensor(), b.full_tensor(), atol=1e-6, rtol=1e-6)
