"""Partitioning samples by token count: data-parallel balance (trainer.balance_batch) and token-budget
micro-batches (use_dynamic_bsz). Pure Python over lists of lengths; callers map the index lists to rows."""

from __future__ import annotations

import heapq
import math


def karmarkar_karp(lengths: list[int], num_parts: int, equal_size: bool = False) -> list[list[int]]:
    """Largest-differencing (Karmarkar-Karp) partition of sample indices into `num_parts` sets of similar sums.

    Each partial solution is a k-tuple of (sum, indices) subsets. Repeatedly merge the two partial solutions whose
    spread (largest minus smallest subset sum) is widest, pairing the largest subset of one with the smallest of
    the other, so the big differences cancel first. With `equal_size` the initial solutions are the items in
    descending order taken k at a time, one per subset, so every merge keeps the subsets equal in size
    (needs len(lengths) % num_parts == 0); that constraint is tight (the heaviest subset must take one item of
    every group), so pairwise swaps then even out what it left (`_refine_by_swaps`).
    Returns the index lists, each sorted, ordered by their smallest index.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if equal_size and len(lengths) % num_parts:
        raise ValueError(f"{len(lengths)} samples cannot form {num_parts} equal-size parts")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if equal_size:
        groups = [order[i : i + num_parts] for i in range(0, len(order), num_parts)]
    else:
        groups = [[i] for i in order]
    heap = []  # (-spread, tie-break, subsets sorted by sum descending)
    for tie, group in enumerate(groups):
        subsets = [(lengths[i], [i]) for i in group] + [(0, []) for _ in range(num_parts - len(group))]
        subsets.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(subsets[0][0] - subsets[-1][0]), tie, subsets))
    tie = len(groups)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(a[j][0] + b[-1 - j][0], a[j][1] + b[-1 - j][1]) for j in range(num_parts)]
        merged.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    parts = [sorted(indices) for _, indices in heap[0][2]] if heap else [[] for _ in range(num_parts)]
    if equal_size:
        _refine_by_swaps(lengths, parts)
    return sorted((sorted(p) for p in parts), key=lambda p: p[0] if p else math.inf)


def _refine_by_swaps(lengths: list[int], parts: list[list[int]]) -> None:
    """Swaps one item between the heaviest and lightest parts while that narrows their gap (sizes unchanged).

    Each swap moves d = len(a) - len(b), 0 < d < gap, choosing d closest to gap / 2; the sum of squared part
    totals strictly drops, so this ends."""
    totals = [packed_cost(lengths, p) for p in parts]
    for _ in range(len(lengths) * len(parts)):
        hi, lo = totals.index(max(totals)), totals.index(min(totals))
        gap = totals[hi] - totals[lo]
        best = None
        for a in parts[hi]:
            for b in parts[lo]:
                d = lengths[a] - lengths[b]
                if 0 < d < gap and (best is None or abs(gap - 2 * d) < abs(gap - 2 * best[2])):
                    best = (a, b, d)
        if best is None:
            return
        a, b, d = best
        parts[hi][parts[hi].index(a)], parts[lo][parts[lo].index(b)] = b, a
        totals[hi] -= d
        totals[lo] += d


def packed_cost(lengths: list[int], part: list[int]) -> int:
    """Tokens a packed (remove-padding) micro-batch computes: the sum of its lengths."""
    return sum(lengths[i] for i in part)


def padded_cost(lengths: list[int], part: list[int]) -> int:
    """Tokens a padded micro-batch computes: rows x its longest sample."""
    return len(part) * max((lengths[i] for i in part), default=0)


def budget_partitions(lengths: list[int], max_tokens: int, packed: bool, min_parts: int = 1) -> list[list[int]]:
    """The fewest micro-batches (at least `min_parts`) whose cost fits `max_tokens` each.

    packed: Karmarkar-Karp over the lengths, so the parts also carry similar token counts.
    padded: samples sorted by length and cut greedily, so each part pads to a similar length (least padding);
    parts are then split in halves, costliest first, until there are `min_parts`.
    """
    if lengths and max(lengths) > max_tokens:
        raise ValueError(f"a sample of {max(lengths)} tokens exceeds the micro-batch token budget {max_tokens}")
    if min_parts > max(len(lengths), 1):
        raise ValueError(f"cannot form {min_parts} non-empty micro-batches from {len(lengths)} samples")
    if packed:
        num_parts = max(min_parts, math.ceil(sum(lengths) / max_tokens), 1)
        while True:
            parts = karmarkar_karp(lengths, num_parts)
            if max(packed_cost(lengths, p) for p in parts) <= max_tokens:
                return parts
            num_parts += 1
    parts: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if parts and padded_cost(lengths, parts[-1] + [i]) <= max_tokens:
            parts[-1].append(i)
        else:
            parts.append([i])
    while len(parts) < min_parts:
        parts.sort(key=lambda p: (-padded_cost(lengths, p), -len(p)))
        widest = next(p for p in parts if len(p) > 1)
        parts.remove(widest)
        parts += [widest[: len(widest) // 2], widest[len(widest) // 2 :]]
    return sorted((sorted(p) for p in parts), key=lambda p: p[0])


def balanced_order(lengths: list[int], num_ranks: int) -> tuple[list[int], dict[str, float]]:
    """A permutation of the samples after which equal consecutive chunks (chunk i goes to data-parallel rank i)
    carry similar token totals (equal-size Karmarkar-Karp), and the global_seqlen/* metrics of the change."""
    size = len(lengths) // num_ranks
    before = [list(range(r * size, (r + 1) * size)) for r in range(num_ranks)]
    after = karmarkar_karp(lengths, num_ranks, equal_size=True)
    return [i for part in after for i in part], imbalance_metrics(lengths, before, after)


def imbalance_metrics(lengths: list[int], before: list[list[int]], after: list[list[int]], prefix: str = "global_seqlen") -> dict[str, float]:
    """Per-rank token totals before and after balancing (verl's global_seqlen/* metrics)."""
    sums = [packed_cost(lengths, p) for p in before]
    balanced = [packed_cost(lengths, p) for p in after]
    return {
        f"{prefix}/min": float(min(sums)), f"{prefix}/max": float(max(sums)), f"{prefix}/minmax_diff": float(max(sums) - min(sums)),
        f"{prefix}/balanced_min": float(min(balanced)), f"{prefix}/balanced_max": float(max(balanced)),
        f"{prefix}/mean": float(sum(sums) / len(sums)),
    }
