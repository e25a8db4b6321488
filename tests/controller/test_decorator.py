import pytest
import torch

from rlcore.controller.decorator import DataLayout, Dispatch, dispatch_and_collect, mean_metrics
from rlcore.protocol import DataProto


def every_rank(world_size: int) -> list[DataLayout]:
    return [DataLayout(r, world_size) for r in range(world_size)]


def local_call(fn):
    """Stands in for the Ray fan-out: runs fn once per rank with that rank's arguments."""
    return lambda per_rank_args, per_rank_kwargs: [fn(rank, *a, **k) for rank, (a, k) in enumerate(zip(per_rank_args, per_rank_kwargs))]


def test_one_to_all_and_rank_zero():
    call = local_call(lambda rank, x: x + rank)
    assert dispatch_and_collect(Dispatch.ONE_TO_ALL, every_rank(3), call, (10,), {}) == [10, 11, 12]
    assert dispatch_and_collect(Dispatch.RANK_ZERO, every_rank(3), call, (10,), {}) == 10


def test_dp_compute_proto_splits_pads_and_restores_order():
    seen = []

    def fn(rank, data):
        seen.append(len(data))
        return DataProto.from_dict({"y": data["x"] * 10, "rank": torch.full((len(data),), rank)})

    data = DataProto.from_dict({"x": torch.arange(5)})
    out = dispatch_and_collect(Dispatch.DP_COMPUTE_PROTO, every_rank(2), local_call(fn), (data,), {})
    assert seen == [3, 3]  # 5 rows padded to 6, 3 per rank
    assert out["y"].tolist() == [0, 10, 20, 30, 40]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]  # contiguous chunks: neighbours stay on one rank


def test_dp_compute_metrics_averages_and_refuses_padding():
    fn = lambda rank, data: {"loss": float(data["x"].sum()), "only0": 1.0} if rank == 0 else {"loss": float(data["x"].sum())}  # noqa: E731
    out = dispatch_and_collect(Dispatch.DP_COMPUTE_METRICS, every_rank(2), local_call(fn), (DataProto.from_dict({"x": torch.arange(4.0)}),), {})
    assert out == {"loss": (1.0 + 5.0) / 2, "only0": 1.0}
    with pytest.raises(ValueError, match="evenly"):
        dispatch_and_collect(Dispatch.DP_COMPUTE_METRICS, every_rank(2), local_call(fn), (DataProto.from_dict({"x": torch.arange(3.0)}),), {})


def test_mean_metrics():
    assert mean_metrics([{"a": 1.0}, {"a": 3.0, "b": 2.0}]) == {"a": 2.0, "b": 2.0}


def test_model_parallel_peers_get_the_same_shard_and_only_output_ranks_are_collected():
    # 4 ranks = 2 replicas x 2 pipeline stages; ranks 0,1 are replica 0 (rank 1 its last stage), ranks 2,3 replica 1
    # (rank 3 last), like a Megatron engine reports them. A stage that is not the last returns nothing.
    layouts = [DataLayout(0, 2, False), DataLayout(0, 2, True), DataLayout(1, 2, False), DataLayout(1, 2, True)]
    seen = {}

    def fn(rank, data):
        seen[rank] = data["x"].tolist()
        return DataProto.from_dict({"y": data["x"] * 10} if layouts[rank].collect else {})

    data = DataProto.from_dict({"x": torch.arange(4)})
    out = dispatch_and_collect(Dispatch.DP_COMPUTE_PROTO, layouts, local_call(fn), (data,), {})
    assert seen == {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    assert out["y"].tolist() == [0, 10, 20, 30]
    metrics = lambda rank, data: {"loss": float(data["x"].sum()) + 100 * (not layouts[rank].collect), "perf/max_mem": float(rank)}  # noqa: E731
    got = dispatch_and_collect(Dispatch.DP_COMPUTE_METRICS, layouts, local_call(metrics), (data,), {})
    assert got == {"loss": (1.0 + 5.0) / 2, "perf/max_mem": 3.0}  # losses of output ranks; peaks of every rank
