"""Weights between pools: training rank 0 streams, every rollout rank receives the same tensors, bit for bit, a
bucket at a time, over a group of their own (each process also has its own default group, as Ray workers do)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from dist_utils import free_port, spawn_ranks  # noqa: E402

from rlcore.rollout.weight_sync import receive_weights, send_weights  # noqa: E402
from rlcore.utils.dist import standalone_group  # noqa: E402


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(64, 32, generator=g),  # 8 KiB: bigger than a bucket on its own
            "layers.0.q.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
            "layers.0.norm.weight": torch.randn(16, generator=g),
            "position.ids": torch.arange(7),
            "scalar.scale": torch.tensor(0.5)}


class Source:
    """A WeightSource that hands out views of one buffer it reuses (what `transient=True` allows)."""

    def rollout_weights(self, bucket_bytes, transient=False, adapted_only=False, trainable_only=False):
        for name, tensor in weights().items():
            scratch = torch.empty_like(tensor)
            scratch.copy_(tensor)
            yield name, scratch
            scratch.zero_()  # reused after the caller moved on


def _rank(rank: int, port: int, out_dir: str) -> None:
    # a process of the rollout pool is rank r + 1 of the weight group; the trainer's rank 0 is its rank 0
    group = standalone_group("127.0.0.1", port, rank, 3, torch.device("cpu"), timeout_s=60)
    if rank == 0:
        stats = {}
        sent = send_weights(Source(), group, 0, bucket_bytes=2048, stats=stats)
        torch.save({"sent": sent, **stats}, os.path.join(out_dir, "sender.pt"))
    else:
        got = {name: t.clone() for name, t in receive_weights(group, rank)}
        torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))


def test_every_rollout_rank_receives_every_tensor_exactly(tmp_path):
    spawn_ranks(_rank, 3, lambda port: (free_port(), str(tmp_path)))
    sender = torch.load(tmp_path / "sender.pt")
    expected = weights()
    assert sender["sent"] == len(expected) and sender["largest"] == 64 * 32 * 4
    assert sender["buckets"] == 2  # the 8 KiB tensor alone, then the small ones together (2 KiB buckets)
    for rank in (1, 2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert list(got) == list(expected)
        for name, tensor in expected.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape and torch.equal(got[name], tensor), name
