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
