"""Validation metrics per data source: verl's `process_validation_metrics` (bootstrapped best, worst and majority
vote of k samples) plus the unbiased pass@k. Pure functions over per-sample lists and numpy.

Samples are grouped by data source and by prompt. For a prompt with N samples and each numeric variable (`reward`,
the summed score, and the scorer's numeric extras such as `acc`):

    mean@N                      mean of the N values; with N > 1 also std@N (population std, as verl)
    best@k/mean, best@k/std     max of k values drawn with replacement from the N, over NUM_BOOTSTRAP draws
    worst@k/mean, worst@k/std   min of the same draws
    maj@k/mean, maj@k/std       the value of the same draws' majority answer (`pred`), if the source has answers
    pass@k                      core variable only: 1 - C(N-c, k) / C(N, k), c = samples whose core variable > 0

for k in bootstrap_sizes(N) = 2, 4, 8, ... below N, then N; pass@k also for k = 1 (c / N, the usual headline).
Best/worst/maj skip k = 1: one random sample's expectation is exactly mean@N, so the bootstrap would only add noise,
and the keys stay verl's. Each metric is then averaged over the source's prompts.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

NUM_BOOTSTRAP = 1000  # resamples per (prompt, k), as verl
BOOTSTRAP_SEED = 42  # verl reseeds numpy with 42 before every bootstrap
CORE_METRICS = ("mean", "maj", "best")  # verl's val-core metric names (of the core variable, at the largest k)


def bootstrap_sizes(num_samples: int) -> list[int]:
    """verl's subset sizes k: 2, 4, 8, ... below num_samples, then num_samples itself; none for a single sample."""
    if num_samples < 2:
        return []
    sizes, k = [], 2
    while k < num_samples:
        sizes.append(k)
        k *= 2
    return sizes + [num_samples]


@functools.lru_cache(maxsize=None)
def bootstrap_indices(num_samples: int, subset_size: int) -> np.ndarray:
    """`[NUM_BOOTSTRAP, subset_size]` sample indices drawn with replacement: exactly verl's draws (np.random.seed(42),
    then one np.random.choice(num_samples, subset_size) per resample), from a private RandomState so the global numpy
    state is left alone. They depend only on the two sizes, so every prompt and variable shares them."""
    indices = np.random.RandomState(BOOTSTRAP_SEED).choice(num_samples, size=(NUM_BOOTSTRAP, subset_size), replace=True)
    indices.flags.writeable = False  # cached and shared
    return indices


def majority_values(values: np.ndarray, preds: Sequence[Hashable], indices: np.ndarray) -> np.ndarray:
    """`[resamples]`: per resample (a row of `indices` `[resamples, k]` into `values` `[N]` and `preds` `[N]`), the
    value of the first drawn sample whose pred is drawn most often. Ties go to the pred drawn first (verl's rule: the
    first maximum of a dict filled in draw order). None, no answer extracted, is a pred like any other (as verl)."""
    codes: dict[Hashable, int] = {}
    drawn = np.array([codes.setdefault(pred, len(codes)) for pred in preds])[indices]  # [resamples, k] pred codes
    num_resamples, num_codes = len(indices), len(codes)
    flat = drawn + np.arange(num_resamples)[:, None] * num_codes
    counts = np.bincount(flat.ravel(), minlength=num_resamples * num_codes).reshape(num_resamples, num_codes)
    votes = np.take_along_axis(counts, drawn, axis=1)  # [resamples, k]: how often each position's pred was drawn
    # The first position holding a top count is the first draw of the first-drawn pred among those with that count.
    winner = votes.argmax(axis=1)
    return values[indices[np.arange(num_resamples), winner]]


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased estimate of P(at least one of k samples is correct) from n samples, c correct:
    1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k / i) (no huge binomials)."""
    if num_samples - num_correct < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(num_samples - num_correct + 1, num_samples + 1)))


def prompt_metrics(values: np.ndarray, preds: Sequence[Hashable] | None) -> dict[str, float]:
    """One prompt's metrics of one variable over its N samples' `values` `[N]`; `preds` `[N]` adds maj@k."""
    n = len(values)
    metrics = {f"mean@{n}": float(np.mean(values))}
    if n == 1:
        return metrics
    metrics[f"std@{n}"] = float(np.std(values))
    for k in bootstrap_sizes(n):
        indices = bootstrap_indices(n, k)
        per_resample = {"best": values[indices].max(axis=1), "worst": values[indices].min(axis=1)}
        if preds is not None:
            per_resample["maj"] = majority_values(values, preds, indices)
        for name, drawn in per_resample.items():
            metrics[f"{name}@{k}/mean"], metrics[f"{name}@{k}/std"] = float(drawn.mean()), float(drawn.std())
    return metrics


def pass_at_k_metrics(correct: np.ndarray) -> dict[str, float]:
    """pass@k of one prompt for k in 1 and bootstrap_sizes(N), from its samples' correctness `[N]` (bool)."""
    n, c = len(correct), int(correct.sum())
    return {f"pass@{k}": pass_at_k(n, c, k) for k in [1] + bootstrap_sizes(n)}


def core_variable(variables: Iterable[str]) -> str:
    """verl's headline variable: `acc` when the scorer returns it, else `reward`."""
    return "acc" if "acc" in variables else "reward"


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


def process_validation_metrics(data_sources: Sequence[str], prompt_ids: Sequence[Hashable],
                               infos: dict[str, Sequence[Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """`{source: {variable: {metric: value}}}`, each metric averaged over the source's prompts.

    `infos`: one value per sample for each variable (`reward`, the scorer's extras, `pred`). A variable gets metrics
    for a source when all the source's samples hold a number in it (`pred` and text extras never do); `pred` gives
    maj@k when any of the source's samples has one. pass@k counts a sample correct when its core variable is > 0.
    """
    rows_by_source: dict[str, dict[Hashable, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, prompt) in enumerate(zip(data_sources, prompt_ids, strict=True)):
        rows_by_source[source][prompt].append(i)
    result = {}
    for source, rows_by_prompt in rows_by_source.items():
        rows = [i for prompt_rows in rows_by_prompt.values() for i in prompt_rows]
        numeric = [var for var, values in infos.items() if var != "pred" and all(_is_number(values[i]) for i in rows)]
        core = core_variable(numeric)
        has_preds = "pred" in infos and any(infos["pred"][i] is not None for i in rows)
        per_prompt: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # var -> metric -> [prompts]
        for prompt_rows in rows_by_prompt.values():
            preds = [infos["pred"][i] for i in prompt_rows] if has_preds else None
            for var in numeric:
                values = np.array([infos[var][i] for i in prompt_rows], dtype=np.float64)
                metrics = prompt_metrics(values, preds)
                if var == core and len(values) > 1:
                    metrics.update(pass_at_k_metrics(values > 0))
                for name, value in metrics.items():
                    per_prompt[var][name].append(value)
        result[source] = {var: {name: float(np.mean(v)) for name, v in metrics.items()} for var, metrics in per_prompt.items()}
    return result


def _num_samples(metric: str) -> int:
    """The N or k in a metric's name: "mean@4" -> 4, "best@2/std" -> 2."""
    return int(metric.split("@")[1].split("/")[0])


def sectioned_metrics(by_source: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """`{section}/{source}/{variable}/{metric}` keys, as verl logs them: `val-core` for the core variable's mean, maj
    and best metrics at the largest k (N), `val-aux` for everything else (pass@k included: verl has no pass@k, and
    val-core stays the set verl users compare)."""
    flat = {}
    for source, variables in by_source.items():
        core = core_variable(variables)
        for var, metrics in variables.items():
            largest = max(map(_num_samples, metrics))
            for name, value in metrics.items():
                in_core = var == core and name.split("@")[0] in CORE_METRICS and _num_samples(name) == largest
                flat[f"{'val-core' if in_core else 'val-aux'}/{source}/{var}/{name}"] = value
    return flat


def concat_columns(batches: Sequence[dict[str, Sequence[Any]]]) -> dict[str, list[Any]]:
    """The per-sample columns of several batches (each a non-empty dict of equal-length lists) joined end to end; a
    column that a batch lacks is None for its samples."""
    keys = dict.fromkeys(key for batch in batches for key in batch)
    sizes = [len(next(iter(batch.values()))) for batch in batches]
    return {key: [value for batch, size in zip(batches, sizes) for value in batch.get(key, [None] * size)] for key in keys}
