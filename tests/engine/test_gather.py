"""Bucketed gathers of row-sharded DTensors give exactly the full tensors, in order, with fewer collectives (or\nnone: through shared memory on one host)."""

from pathlib import Path

import pytest
import torch
from dist_utils import close_gloo, init_gloo, spawn_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

SHAPES = [(5, 3), (1, 4), (7,), (4, 2, 3), (3, 3), (6, 1)]  # dim 0 uneven, smaller than the world, 1-D, 3-D


def full_tensors():
    g = torch.Generator().manual_seed(0)
    out = [(f"w{i}", torch.randn(shape, generator=g)) for i, shape in enumerate(SHAPES)]
    out.insert(3, ("half", torch.randn(5, 2, generator=g).bfloat16()))  # another dtype starts a new bucket
    out.insert(5, ("replicated", torch.randn(3, generator=g)))  # not row-sharded: gathered alone, in order
    return out


def _rank(rank, world, port, out_dir):
    from rlcore.engine import gather, shm_exchange
    from rlcore.engine.shm_exchange import SharedMemoryExchange

    init_gloo(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    sharded = [(n, distribute_tensor(t, mesh, [Replicate() if n == "replicated" else Shard(0)])) for n, t in full_tensors()]
    calls = []
    real = gather.all_gather_flat
    gather.all_gather_flat = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    results = {}
    for bucket_bytes in (0, 96, 2**30):
        calls.clear()
        results[bucket_bytes] = (list(gather.gather_full_tensors(sharded, bucket_bytes, torch.device("cpu"))), len(calls))
    # Through shared memory: the buffer is reused, so each tensor is copied before the next is drawn (as the sync does).
    exchange = SharedMemoryExchange.for_group(mesh.get_group())
    for bucket_bytes in (96, 2**30, "again"):
        calls.clear()
        stream = gather.gather_full_tensors(sharded, 2**30 if bucket_bytes == "again" else bucket_bytes, torch.device("cpu"), exchange)
        results[("shm", bucket_bytes)] = ([(n, t.clone()) for n, t in stream], len(calls))
        if bucket_bytes == 2**30:
            segment = exchange.buffer.data_ptr()
    results["segment reused"] = exchange.buffer.data_ptr() == segment
    shm_exchange.SHM_DIR = "/nonexistent"  # no room in shared memory: the buckets fall back to the all-gather
    calls.clear()
    stream = gather.gather_full_tensors(sharded, 2**30, torch.device("cpu"), SharedMemoryExchange.for_group(mesh.get_group()))
    results[("no shm", 2**30)] = ([(n, t.clone()) for n, t in stream], len(calls))
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    close_gloo()


@pytest.mark.parametrize("world", [2, 3])
def test_bucketed_gather_equals_the_full_tensors(tmp_path, world):
    spawn_ranks(_rank, world, lambda port: (world, port, str(tmp_path)))
    want = full_tensors()
    for rank in range(world):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert results.pop("segment reused")
        for bucket_bytes, (got, _) in results.items():
            assert [n for n, _ in got] == [n for n, _ in want], bucket_bytes
            for (name, g), (_, w) in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g, w), (bucket_bytes, name)
        # Buckets: w0 w1 w2 | half | w3 | (replicated) | w4 w5. A bucket of one tensor is that tensor's own
        # full_tensor(); the two larger ones are one flat all-gather each. Bucket 0: every tensor alone.
        assert results[2**30][1] == 2 and results[0][1] == 0
        assert results[("shm", 2**30)][1] == 0  # the stripes travel through shared memory, not the all-gather
        assert results[("no shm", 2**30)][1] == 2
    assert not list(Path("/dev/shm").glob("rlcore-weights-*"))  # unlinked once mapped
