"""Megatron's weight export buckets count what the TP all-gather receives, not this rank's pieces."""

import torch

from rlcore.engine.megatron.weights import Entry, _buckets, _Manifest


def manifest(shapes, stage=0):
    return [_Manifest(stage, Entry(0, f"p{i}", "split1", (f"w{i}",)), shape, torch.float32) for i, shape in enumerate(shapes)]


def test_a_bucket_holds_at_most_bucket_bytes_once_gathered_over_tp():
    pieces = manifest([(64, 16)] * 8)  # 4 KiB per local piece
    for tp in (1, 2, 4):
        buckets = list(_buckets(pieces, bucket_bytes=16 * 1024, tp=tp))
        gathered = [sum(torch.Size(m.shape).numel() * 4 * tp for m in b) for b in buckets]
        assert max(gathered) <= 16 * 1024 and sum(len(b) for b in buckets) == 8
        assert len(buckets) == {1: 2, 2: 4, 4: 8}[tp]  # TP4: one 4 KiB piece gathers to the whole 16 KiB


def test_an_entry_larger_than_the_bucket_travels_alone_and_stages_do_not_mix():
    big = manifest([(8, 8), (256, 64), (8, 8)])
    assert [len(b) for b in _buckets(big, bucket_bytes=4096, tp=2)] == [1, 1, 1]
    mixed = manifest([(8, 8)], stage=0) + manifest([(8, 8)], stage=1)
    assert [[m.stage for m in b] for b in _buckets(mixed, bucket_bytes=1 << 20, tp=2)] == [[0], [1]]
