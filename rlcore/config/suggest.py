"""Nearest valid values for a fix: the arithmetic behind every "use key=value" the validator prints."""

from __future__ import annotations

from typing import Callable, Iterable, List


def _nearest(value: int, ok: Callable[[int], bool], lo: int, hi: int) -> List[int]:
    """The closest integers below and above `value` (value itself excluded) in [lo, hi] that satisfy `ok`."""
    below = next((v for v in range(min(value - 1, hi), lo - 1, -1) if ok(v)), None)
    above = next((v for v in range(max(value + 1, lo), hi + 1) if ok(v)), None)
    return [v for v in (below, above) if v is not None]


def _suggest(value: int, tiers: Iterable[Callable[[int], bool]], lo: int, hi: int) -> List[int]:
    """Nearest values from the strictest tier that has any (tiers go from all constraints to the rule alone)."""
    for ok in tiers:
        found = _nearest(value, ok, lo, hi)
        if found:
            return found
    return []


def _use(key: str, values: List[int]) -> str:
    return "use " + " or ".join(f"{key}={v}" for v in values) if values else ""


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
