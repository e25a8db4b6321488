"""Token-balanced partitions: Karmarkar-Karp for data-parallel balance and token-budget micro-batches."""

import itertools
import random

import pytest

from rlcore.data.seqlen_balancing import (
    balanced_order,
    budget_partitions,
    karmarkar_karp,
    packed_cost,
    padded_cost,
)


def sums(lengths, parts):
    return [packed_cost(lengths, p) for p in parts]


def is_partition(parts, n):
    return sorted(i for p in parts for i in p) == list(range(n))


def test_karmarkar_karp_two_way_by_hand():
    # Differencing: 8-7 -> 1, 6-5 -> 1, then {4, 1, 1}: 4-1 -> 3, 3-1 -> 2. Final sets {8, 6} = 14 and {7, 5, 4} = 16.
    assert karmarkar_karp([8, 7, 6, 5, 4], 2) == [[0, 2], [1, 3, 4]]


@pytest.mark.parametrize("equal_size", [False, True])
def test_karmarkar_karp_balances_skewed_lengths_far_better_than_chunks(equal_size):
    rng = random.Random(0)
    lengths = [int(rng.lognormvariate(4, 1)) + 1 for _ in range(64)]
    parts = karmarkar_karp(lengths, 4, equal_size)
    assert is_partition(parts, 64)
    if equal_size:
        assert [len(p) for p in parts] == [16] * 4
    spread = max(sums(lengths, parts)) - min(sums(lengths, parts))
    chunks = [list(range(i, i + 16)) for i in range(0, 64, 16)]
    assert spread <= 0.01 * sum(lengths)
    assert spread < (max(sums(lengths, chunks)) - min(sums(lengths, chunks))) / 10


def test_karmarkar_karp_is_optimal_on_small_cases_it_can_solve_exactly():
    # Where a perfect split exists among few items, largest-differencing finds a near-perfect one: never worse
    # than the greedy (longest-first into the lightest set) partition.
    rng = random.Random(1)
    for _ in range(50):
        lengths = [rng.randint(1, 50) for _ in range(8)]
        kk = max(sums(lengths, karmarkar_karp(lengths, 2)))
        best = min(max(sum(c), sum(lengths) - sum(c)) for r in range(9) for c in itertools.combinations(lengths, r))
        greedy = [0, 0]
        for v in sorted(lengths, reverse=True):
            greedy[greedy.index(min(greedy))] += v
        assert best <= kk <= max(greedy)


def test_packed_budget_partitions_fit_and_use_the_fewest_parts():
    rng = random.Random(2)
    lengths = [rng.randint(1, 100) for _ in range(40)]
    parts = budget_partitions(lengths, 300, packed=True)
    assert is_partition(parts, 40)
    assert max(sums(lengths, parts)) <= 300
    assert len(parts) == -(-sum(lengths) // 300)  # ceil(total / budget): balanced enough to need no extra part
    assert len(budget_partitions(lengths, 300, packed=True, min_parts=25)) == 25


def test_padded_budget_partitions_group_similar_lengths():
    lengths = [100, 10, 12, 95, 11, 9, 98, 10]
    parts = budget_partitions(lengths, 200, packed=False)
    # Longest first, cut when rows x longest would pass 200: {100, 98}, {95, 12}, then the four shortest.
    assert all(padded_cost(lengths, p) <= 200 for p in parts)
    assert parts == [[0, 6], [1, 4, 5, 7], [2, 3]]
    split = budget_partitions(lengths, 200, packed=False, min_parts=5)
    assert len(split) == 5 and is_partition(split, 8) and all(padded_cost(lengths, p) <= 200 for p in split)


def test_budget_errors_name_the_problem():
    with pytest.raises(ValueError, match="exceeds the micro-batch token budget 50"):
        budget_partitions([10, 60], 50, packed=True)
    with pytest.raises(ValueError, match="cannot form 3 non-empty micro-batches from 2 samples"):
        budget_partitions([10, 20], 50, packed=True, min_parts=3)


def test_balanced_order_equalises_rank_chunks_and_reports_it():
    lengths = [100, 90, 80, 70, 10, 10, 10, 10]  # chunked as is: rank 0 gets 340 tokens, rank 1 gets 40
    order, metrics = balanced_order(lengths, 2)
    assert sorted(order) == list(range(8))
    halves = [sum(lengths[i] for i in order[:4]), sum(lengths[i] for i in order[4:])]
    assert halves == [190, 190]
    assert metrics == {"global_seqlen/min": 40.0, "global_seqlen/max": 340.0, "global_seqlen/minmax_diff": 300.0,
                       "global_seqlen/balanced_min": 190.0, "global_seqlen/balanced_max": 190.0, "global_seqlen/mean": 190.0}
