"""Validation metrics by hand: verl's bootstrapped best/worst/maj@k, the unbiased pass@k and the val-core split."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from rlcore.trainer.val_metrics import (
    NUM_BOOTSTRAP,
    bootstrap_sizes,
    concat_columns,
    majority_values,
    pass_at_k,
    process_validation_metrics,
    prompt_metrics,
    sectioned_metrics,
)


def bootstrap_error(p):
    """4 standard errors of a mean of NUM_BOOTSTRAP draws of a 0/1 value with mean p."""
    return 4 * math.sqrt(p * (1 - p) / NUM_BOOTSTRAP)


def verl_bootstrap(values, preds, k):
    """verl's bootstrap_metric written out as a loop: seed 42, one choice() per resample, Counter for the vote (its
    most_common keeps first-drawn order among ties)."""
    rng = np.random.RandomState(42)  # the stream np.random.seed(42) starts
    best, worst, maj = [], [], []
    for _ in range(NUM_BOOTSTRAP):
        idx = rng.choice(len(values), size=k, replace=True)
        best.append(max(values[i] for i in idx))
        worst.append(min(values[i] for i in idx))
        winner = Counter(preds[i] for i in idx).most_common(1)[0][0]
        maj.append(next(values[i] for i in idx if preds[i] == winner))
    return {name: (np.mean(v), np.std(v)) for name, v in (("best", best), ("worst", worst), ("maj", maj))}


def test_bootstrap_sizes_are_powers_of_two_below_n_then_n():
    assert [bootstrap_sizes(n) for n in (1, 2, 3, 4, 5, 8)] == [[], [2], [2, 3], [2, 4], [2, 4, 5], [2, 4, 8]]


def test_one_correct_of_four_by_hand_and_exactly_verls_bootstrap():
    values = np.array([1.0, 0.0, 0.0, 0.0])
    metrics = prompt_metrics(values, None)
    assert set(metrics) == {"mean@4", "std@4"} | {f"{m}@{k}/{s}" for m in ("best", "worst") for k in (2, 4) for s in ("mean", "std")}
    assert metrics["mean@4"] == 0.25 and metrics["std@4"] == pytest.approx(math.sqrt(0.25 * 0.75))
    # best of k draws with replacement is 1 unless all k miss the one correct sample: 1 - (3/4)^k; worst: (1/4)^k
    for k in (2, 4):
        best, worst = 1 - 0.75**k, 0.25**k
        assert metrics[f"best@{k}/mean"] == pytest.approx(best, abs=bootstrap_error(best))
        assert metrics[f"best@{k}/std"] == pytest.approx(math.sqrt(best * (1 - best)), abs=0.03)
        assert metrics[f"worst@{k}/mean"] == pytest.approx(worst, abs=bootstrap_error(worst) + 1e-3)
        reference = verl_bootstrap(values, ["a"] * 4, k)
        assert (metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"]) == reference["best"]  # exactly, not approximately
        assert (metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"]) == reference["worst"]
    assert prompt_metrics(values, None) == metrics  # reproducible
    np.random.seed(7)
    state = np.random.get_state()[1].copy()
    prompt_metrics(np.array([1.0, 0.0, 1.0]), None)
    assert (np.random.get_state()[1] == state).all()  # the global numpy stream is left alone


def test_majority_value_ties_go_to_the_first_drawn_answer():
    values = np.array([1.0, 0.0, 0.5, 0.25])
    preds = ["a", "b", "b", "c"]
    # b twice -> b's first draw (sample 1); all different -> the first draw (a); a twice beats c -> sample 0
    assert majority_values(values, preds, np.array([[0, 1, 1], [0, 1, 3], [3, 0, 0]])).tolist() == [0.0, 1.0, 1.0]
    # a and b drawn twice each: b was drawn first, and its value is that of b's first draw (sample 2, not 3)
    assert majority_values(np.array([1.0, 0.5, 0.0, 0.2]), ["a", "a", "b", "b"], np.array([[2, 0, 3, 1]])).tolist() == [0.0]
    assert majority_values(values, [None, None, "c", "c"], np.array([[0, 2, 1]])).tolist() == [1.0]  # None is an answer too


def test_maj_at_k_is_the_exact_expectation_within_bootstrap_error_and_verls_numbers():
    values = [1.0, 1.0, 0.0, 0.0]
    preds = ["7", "7", "8", "9"]  # the right answer twice, two different wrong ones
    metrics = prompt_metrics(np.array(values), preds)
    for k in (2, 4):
        draws = list(itertools.product(range(4), repeat=k))  # all equally likely ordered draws
        exact = np.mean([values[next(i for i in d if preds[i] == Counter(preds[j] for j in d).most_common(1)[0][0])] for d in draws])
        assert metrics[f"maj@{k}/mean"] == pytest.approx(exact, abs=bootstrap_error(exact))
        assert (metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"]) == verl_bootstrap(values, preds, k)["maj"]
    # k = 2 by hand: two draws agree or tie, and a tie goes to the first draw: maj@2 is the first draw's value, 1/2
    assert metrics["maj@2/mean"] == pytest.approx(0.5, abs=bootstrap_error(0.5))


@pytest.mark.parametrize("n, c", [(4, 1), (5, 2), (10, 0), (10, 10), (200, 3), (1000, 999)])
def test_pass_at_k_is_the_closed_form(n, c):
    for k in [1] + bootstrap_sizes(n):
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12, abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)


def test_pass_at_2_of_five_with_two_correct_by_hand():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2) / C(5,2) pairs hold no correct sample


def test_tiny_add_with_four_samples_gives_verls_keys_and_averages_over_prompts():
    # prompt 0: two of four right; prompt 1: one of four right; the n samples of a prompt are adjacent
    rewards = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    preds = ["5", "5", "6", "x", "2", "3", "3", "4"]
    by_source = process_validation_metrics(["tiny_add"] * 8, [0] * 4 + [1] * 4, {"reward": rewards, "pred": preds})
    metrics = sectioned_metrics(by_source)
    core = {f"val-core/tiny_add/reward/{m}" for m in ("mean@4", "best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std")}
    aux = {f"val-aux/tiny_add/reward/{m}" for m in ("std@4", "best@2/mean", "best@2/std", "worst@2/mean", "worst@2/std",
                                                     "maj@2/mean", "maj@2/std", "worst@4/mean", "worst@4/std", "pass@1", "pass@2", "pass@4")}
    assert set(metrics) == core | aux
    assert metrics["val-core/tiny_add/reward/mean@4"] == 0.375
    assert metrics["val-aux/tiny_add/reward/std@4"] == pytest.approx((0.5 + math.sqrt(3) / 4) / 2)
    assert metrics["val-aux/tiny_add/reward/pass@1"] == pytest.approx(0.375)
    assert metrics["val-aux/tiny_add/reward/pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)  # 1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2)
    assert metrics["val-aux/tiny_add/reward/pass@4"] == 1.0
    one = prompt_metrics(np.array(rewards[4:]), preds[4:])  # the prompts are averaged metric by metric
    zero = prompt_metrics(np.array(rewards[:4]), preds[:4])
    assert metrics["val-core/tiny_add/reward/maj@4/mean"] == pytest.approx((zero["maj@4/mean"] + one["maj@4/mean"]) / 2)


def test_acc_is_the_core_variable_and_text_extras_get_no_metrics():
    infos = {"reward": [1.0, 0.1, 0.1, 0.0], "acc": [1.0, 0.0, 0.0, 0.0], "pred": ["7", "8", "8", None], "note": ["a", "b", "c", "d"]}
    metrics = sectioned_metrics(process_validation_metrics(["gsm8k"] * 4, [0] * 4, infos))
    assert sorted(k for k in metrics if k.startswith("val-core/")) == [
        f"val-core/gsm8k/acc/{m}" for m in ("best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std", "mean@4")]
    assert metrics["val-aux/gsm8k/reward/mean@4"] == pytest.approx(0.3) and metrics["val-core/gsm8k/acc/mean@4"] == 0.25
    assert "val-aux/gsm8k/acc/pass@4" in metrics and not any("/reward/pass@" in k for k in metrics)  # correct: acc > 0
    assert not any("/note/" in k or "/pred/" in k for k in metrics)


def test_one_sample_per_prompt_gives_only_the_mean():
    infos = {"reward": [1.0, 0.0, 1.0], "pred": ["2", "3", "4"]}
    assert sectioned_metrics(process_validation_metrics(["tiny_add"] * 3, [0, 1, 2], infos)) == {"val-core/tiny_add/reward/mean@1": pytest.approx(2 / 3)}


def test_sources_are_separate_and_a_variable_some_samples_lack_is_left_out():
    infos = concat_columns([{"reward": [1.0, 0.0], "acc": [True, False]}, {"reward": [0.5, 0.5], "pred": ["1", "1"]}])
    assert infos == {"reward": [1.0, 0.0, 0.5, 0.5], "acc": [True, False, None, None], "pred": [None, None, "1", "1"]}
    metrics = sectioned_metrics(process_validation_metrics(["a", "a", "b", "b"], [0, 0, 1, 1], infos))
    assert metrics["val-core/a/acc/mean@2"] == 0.5 and "val-aux/a/reward/mean@2" in metrics and not any("/a/" in k and "maj" in k for k in metrics)
    assert metrics["val-core/b/reward/mean@2"] == 0.5 and metrics["val-core/b/reward/maj@2/mean"] == 0.5
    assert not any(k.startswith("val-core/b/acc") or k.startswith("val-aux/b/acc") for k in metrics)
