"""Micro-batch formation: fixed slices, token budgets with order restored, padding trimmed, ranks agreeing."""

import pytest
import torch
import torch.distributed as dist
from dist_utils import close_gloo, init_gloo, make_rollout_batch, spawn_ranks

from rlcore.data.micro_batches import MicroBatchSpec, make_micro_batches, restore_order, token_budget_partitions, trim_padding
from rlcore.protocol import DataProto


@pytest.fixture
def data():
    return DataProto.from_dict(make_rollout_batch(12, 6, 8, 50, seed=4), {"uid": [f"u{i}" for i in range(12)]})


def test_spec_needs_exactly_one_mode():
    with pytest.raises(ValueError, match="exactly one of rows / max_tokens"):
        MicroBatchSpec(rows=4, max_tokens=100)


def test_fixed_micro_batches_are_slices_at_full_width(data):
    parts, order = make_micro_batches(data, MicroBatchSpec(rows=5))
    assert [len(p) for p in parts] == [5, 5, 2] and order is None
    assert all(p.batch["input_ids"].shape[1] == 14 for p in parts)


@pytest.mark.parametrize("packed", [True, False])
def test_token_budget_micro_batches_fit_cover_every_row_and_restore_order(data, packed):
    parts, order = make_micro_batches(data, MicroBatchSpec(max_tokens=30, packed=packed))
    lengths = data.batch["attention_mask"].sum(-1)
    assert sorted(order.tolist()) == list(range(12)) and len(parts) > 1
    for part in parts:
        tokens = part.batch["attention_mask"].sum(-1)
        cost = tokens.sum() if packed else len(part) * tokens.max()
        assert cost <= 30
    # A per-row output computed micro-batch by micro-batch comes back in the batch's own order.
    outputs = {"uid_index": torch.cat([torch.tensor([int(u[1:]) for u in p.non_tensor_batch["uid"]]) for p in parts]),
               "length": torch.cat([p.batch["attention_mask"].sum(-1) for p in parts])}
    restored = restore_order(outputs, order)
    assert restored["uid_index"].tolist() == list(range(12))
    assert torch.equal(restored["length"], lengths)


def test_trim_padding_drops_only_all_padding_columns():
    b = make_rollout_batch(3, 6, 8, 50, seed=1)
    b["attention_mask"][:, :2] = 0  # no prompt starts before column 2
    b["attention_mask"][:, 6 + 5 :] = 0  # no response is longer than 5
    b["attention_mask"][0, 2:11] = 1  # row 0 spans exactly the columns that remain
    b["response_mask"] = b["attention_mask"][:, 6:].clone()
    data = DataProto.from_dict(b)
    trimmed = trim_padding(data)
    assert trimmed.batch["input_ids"].shape == (3, 4 + 5)
    assert trimmed.batch["responses"].shape == trimmed.batch["old_log_probs"].shape == (3, 5)
    assert torch.equal(trimmed.batch["input_ids"], data.batch["input_ids"][:, 2:11])
    assert torch.equal(trimmed.batch["position_ids"], data.batch["position_ids"][:, 2:11])  # positions unchanged
    assert torch.equal(trimmed.batch["response_mask"], data.batch["response_mask"][:, :5])


def _agree_main(rank: int, port: int, out_path: str) -> None:
    init_gloo(rank, 2, port)
    # Rank 0 holds short samples (fits in 1 part), rank 1 long ones (needs 4): both must run 4.
    lengths = [5] * 8 if rank == 0 else [25] * 8
    parts = token_budget_partitions(lengths, 50, packed=True)
    counts = torch.tensor([len(parts)])
    gathered = [torch.zeros(1, dtype=torch.long) for _ in range(2)]
    dist.all_gather(gathered, counts)
    if rank == 0:
        torch.save([int(c) for c in gathered], out_path)
    close_gloo()


def test_ranks_agree_on_the_number_of_micro_batches(tmp_path):
    out = str(tmp_path / "counts.pt")
    spawn_ranks(_agree_main, 2, lambda port: (port, out))
    assert torch.load(out) == [4, 4]
