"""Offloaded state goes into host buffers allocated once per tensor (accelerators), or fresh copies (CPU engines)."""

import torch

from rlcore.engine.host_buffers import HostBuffers


def test_kept_buffers_are_refilled_in_place():
    host = HostBuffers(torch.device("cpu"), keep=True)  # as on CUDA (pinned there), minus the pinning
    first = host.to_host("w", torch.arange(6.0))
    again = host.to_host("w", torch.arange(6.0) * 2)
    assert again is first and again.data_ptr() == first.data_ptr() and torch.equal(again, torch.arange(6.0) * 2)
    resized = host.to_host("w", torch.ones(3))
    assert resized is not first and torch.equal(resized, torch.ones(3))  # a new shape gets a new buffer
    assert host.to_host("other", torch.zeros(2)) is not resized


def test_a_cpu_engine_gets_fresh_copies_and_keeps_nothing():
    host = HostBuffers(torch.device("cpu"))
    source = torch.arange(4.0)
    copy = host.to_host("w", source)
    assert copy.data_ptr() != source.data_ptr() and torch.equal(copy, source)
    assert host.to_host("w", source) is not copy and host.buffers == {}


def test_a_dtensor_keeps_its_layout_through_a_kept_buffer():
    """FSDP2's AdamW moments are DTensors: copying one into a plain host buffer raised "got mixed torch.Tensor and
    DTensor" at the first optimizer offload on an H200 (CPU engines take the fresh-copy path, which never showed it)."""
    from dist_utils import close_gloo, free_port, init_gloo
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    init_gloo(0, 1, free_port())
    mesh = init_device_mesh("cpu", (1,))
    moment = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)])
    host = HostBuffers(torch.device("cpu"), keep=True)
    first = host.to_host("exp_avg", moment)
    again = host.to_host("exp_avg", moment * 2)
    # The shard itself, in the kept buffer: a DTensor on a CUDA mesh would copy a host tensor back to the device.
    assert type(again) is torch.Tensor and again.data_ptr() == first.data_ptr() == host.buffers["exp_avg"].data_ptr()
    back = host.to_device("exp_avg", again, torch.device("cpu"))
    assert isinstance(back, DTensor) and back.placements == moment.placements and back.device_mesh == mesh
    assert torch.equal(back.full_tensor(), torch.arange(12.0).reshape(4, 3) * 2)
    assert type(host.to_device("plain", torch.ones(2), torch.device("cpu"))) is torch.Tensor
    close_gloo()
