"""Rollout correction (verl's algorithm.rollout_correction): every figure below is worked out by hand from two
sequences whose per-token ratios rho = pi_train / pi_rollout are chosen: [3, 1 | pad] and [1, 1/4, 3/2]."""

import math

import pytest
import torch

from rlcore.algos.rollout_corr import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_AGGREGATIONS,
    ROLLOUT_RS_LEVELS,
    ROLLOUT_RS_STATISTICS,
    bypass_mode_loss,
    mismatch_metrics,
    rollout_correction,
    rollout_is_weights,
    rollout_rs_mask,
)

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
LOG_RATIO = torch.tensor([[math.log(3), 0.0, 5.0], [0.0, -math.log(4), math.log(1.5)]])  # 5.0 on padding: must be ignored
OLD = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -0.5, -1.0]])
ROLLOUT = OLD - LOG_RATIO
RHO = [3.0, 1.0, 1.0, 0.25, 1.5]  # the 5 valid tokens
SEQ = [3.0, 0.375]  # products per sequence


def test_mismatch_metrics_hand_computed():
    m = mismatch_metrics(OLD, ROLLOUT, MASK, threshold=2.0)
    lr = [math.log(r) for r in RHO]
    assert m["kl"] == pytest.approx(-sum(lr) / 5)  # = -ln(1.125) / 5: k1 can be negative; k3 cannot
    assert m["k3_kl"] == pytest.approx(sum(r - math.log(r) - 1 for r in RHO) / 5)
    assert m["log_ratio_mean"] == pytest.approx(math.log(1.125) / 5)
    assert m["log_ratio_abs_max"] == pytest.approx(math.log(4))  # the padding's 5.0 does not count
    assert m["chi2_token"] == pytest.approx(sum(r * r for r in RHO) / 5 - 1)
    assert (m["ratio_fraction_high"], m["ratio_fraction_low"]) == (pytest.approx(0.2), pytest.approx(0.2))  # rho 3 > 2, 1/4 < 1/2
    assert m["chi2_seq"] == pytest.approx((9 + 0.375 ** 2) / 2 - 1)
    train_lp, rollout_lp = [-1.5, -2 / 3], [-1.5 - math.log(3) / 2, -2 / 3 + (math.log(4) - math.log(1.5)) / 3]
    assert m["training_log_ppl"] == pytest.approx((1.5 + 2 / 3) / 2)
    assert m["training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(2 / 3)) / 2)
    assert m["rollout_ppl"] == pytest.approx(sum(math.exp(-x) for x in rollout_lp) / 2)
    diff = [r - t for r, t in zip(rollout_lp, train_lp)]  # -ln3/2 and ln(8/3)/3
    assert (m["log_ppl_diff"], m["log_ppl_abs_diff"]) == (pytest.approx(sum(diff) / 2), pytest.approx(sum(map(abs, diff)) / 2))
    assert (m["log_ppl_diff_max"], m["log_ppl_diff_min"]) == (pytest.approx(math.log(8 / 3) / 3), pytest.approx(-math.log(3) / 2))
    assert m["ppl_ratio"] == pytest.approx((3 ** -0.5 + (8 / 3) ** (1 / 3)) / 2)


def test_identical_log_probs_show_no_mismatch():
    m = mismatch_metrics(OLD, OLD, MASK, threshold=2.0)
    assert all(m[k] == 0.0 for k in ("kl", "k3_kl", "log_ratio_mean", "log_ratio_abs_max", "chi2_token", "chi2_seq", "log_ppl_diff"))


def test_token_level_truncated_is():
    w, m = rollout_is_weights(LOG_RATIO, MASK, "token", threshold=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.25, 1.5]]))  # 3 truncated to 2, padding 0
    assert m["rollout_is_mean"] == pytest.approx(6.75 / 5)  # before truncation
    assert (m["rollout_is_max"], m["rollout_is_min"]) == (pytest.approx(3.0), pytest.approx(0.25))
    assert (m["rollout_is_ratio_fraction_high"], m["rollout_is_ratio_fraction_low"]) == (pytest.approx(0.2), pytest.approx(0.2))
    # ESS of the weights clamped to [1/2, 2]: [2, 1, 1, .5, 1.5], mean 1.2: 1 / mean((v / 1.2)^2) = 7.2 / 8.5
    assert m["rollout_is_eff_sample_size"] == pytest.approx(7.2 / 8.5)
    w, m = rollout_is_weights(LOG_RATIO, MASK, "token", threshold=2.0, batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(5.75 / 5)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.25, 1.5]]) / 1.15)
    assert not w.requires_grad


def test_a_band_zeroes_the_weights_outside_it_icepop():
    # verl 0.9's rollout_is_threshold="0.5_4.0" (its Hunyuan-v3 script): rho inside [lower, upper] kept as it is,
    # outside zeroed; rho 3 in [0.5, 4] stays 3 (no truncation), rho 1/4 drops out
    w, m = rollout_is_weights(LOG_RATIO, MASK, "token", threshold="0.5_4.0")
    assert torch.allclose(w, torch.tensor([[3.0, 1.0, 0.0], [1.0, 0.0, 1.5]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(0.2)
    assert (m["rollout_is_ratio_fraction_high"], m["rollout_is_ratio_fraction_low"]) == (0.0, pytest.approx(0.2))
    w, _ = rollout_is_weights(LOG_RATIO, MASK, "sequence", threshold="0.5_2")  # products 3 and 0.375: both out
    assert not w.any()
    with pytest.raises(ValueError, match="a band lower_upper needs 0 < lower <= upper"):
        rollout_is_weights(LOG_RATIO, MASK, "token", threshold="4_0.5")


def test_sequence_level_truncated_is():
    w, m = rollout_is_weights(LOG_RATIO, MASK, "sequence", threshold=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 0.0], [0.375, 0.375, 0.375]]))  # product 3 -> 2; 0.375 kept
    assert m["rollout_is_mean"] == pytest.approx((3 * 2 + 0.375 * 3) / 5)
    assert (m["rollout_is_ratio_fraction_high"], m["rollout_is_ratio_fraction_low"]) == (pytest.approx(0.4), pytest.approx(0.6))
    _, m = rollout_is_weights(LOG_RATIO, MASK, "sequence", threshold=2.0, batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx((2 + 0.375) / 2)  # one weight per sequence


def test_rejection_sampling_at_each_level():
    mask, m = rollout_rs_mask(LOG_RATIO, MASK, "token", threshold=2.0)
    assert mask.tolist() == [[0, 1, 0], [1, 0, 1]]  # rho 3 and rho 1/4 leave the band [1/2, 2]
    assert (m["rollout_rs_masked_fraction"], m["rollout_rs_seq_masked_fraction"]) == (pytest.approx(0.4), 1.0)
    mask, m = rollout_rs_mask(LOG_RATIO, MASK, "geometric", threshold=1.5)
    assert mask.tolist() == [[0, 0, 0], [1, 1, 1]]  # geometric means sqrt(3) = 1.73 > 1.5 and 0.375^(1/3) = 0.72 > 2/3
    assert (m["rollout_rs_masked_fraction"], m["rollout_rs_seq_masked_fraction"]) == (pytest.approx(0.4), 0.5)
    assert rollout_rs_mask(LOG_RATIO, MASK, "sequence", threshold=4.0)[0].tolist() == MASK.tolist()  # 3 and 0.375 in [1/4, 4]
    assert rollout_rs_mask(LOG_RATIO, MASK, "sequence", threshold=2.5)[0].tolist() == [[0, 0, 0], [0, 0, 0]]  # 0.375 < 0.4


def test_rollout_correction_combines_is_rs_and_metrics_under_the_prefix():
    weights, mask, m = rollout_correction(OLD, ROLLOUT, MASK, "token", 2.0, "token", 2.0)
    assert torch.allclose(weights, torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.25, 1.5]])) and mask.tolist() == [[0, 1, 0], [1, 0, 1]]
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.4) and m["rollout_corr/kl"] == pytest.approx(-math.log(1.125) / 5)
    weights, mask, m = rollout_correction(OLD, ROLLOUT, MASK, None, 2.0, None, None)  # measuring only
    assert weights is None and mask is MASK and "rollout_corr/rollout_is_mean" not in m and "rollout_corr/k3_kl" in m


def test_levels_are_verls_and_unknown_ones_list_the_valid_ones():
    assert ROLLOUT_IS_LEVELS.names() == ["sequence", "token"] and ROLLOUT_RS_LEVELS.names() == ["geometric", "sequence", "token"]
    with pytest.raises(ValueError, match=r"algorithm.rollout_correction.rollout_is='seq'; valid: sequence, token"):
        rollout_is_weights(LOG_RATIO, MASK, "seq", 2.0)


def bypass(loss_type, rollout_is=None, rollout_rs=None, rollout_rs_threshold=2.0, batch_normalize=False):
    log_prob = (ROLLOUT + LOG_RATIO).clone().requires_grad_(True)  # this forward: rho as above against the rollout
    loss_mat, kept, stats = bypass_mode_loss(ROLLOUT, log_prob, torch.ones(2, 3), MASK, loss_type, rollout_is, 2.0, rollout_rs, rollout_rs_threshold,
                                             batch_normalize, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    loss_mat.sum().backward()
    return loss_mat.detach(), kept, stats, log_prob.grad


def test_bypass_reinforce_weights_the_log_prob_gradient():
    loss, kept, stats, grad = bypass("reinforce", rollout_is="token")
    w = torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.25, 1.5]])  # truncated at 2, zero on padding
    assert torch.allclose(loss, -w * OLD * MASK) and torch.allclose(grad, -w * MASK)  # L = -A w log pi: grad -A w
    assert torch.allclose(stats["actor/ppo_kl"], -LOG_RATIO)
    # batch-normalised (verl 0.9's rollout-correction script): w over its mean on the micro-batch's 5 real tokens
    _, _, _, grad = bypass("reinforce", rollout_is="token", batch_normalize=True)
    assert torch.allclose(grad, -w / (5.75 / 5) * MASK)
    loss, kept, _, grad = bypass("reinforce", rollout_rs="token")  # no IS: w = 1, rho 3 and 1/4 rejected
    assert kept.tolist() == [[0, 1, 0], [1, 0, 1]] and torch.allclose(grad, -kept.float())  # -A x 1 on kept tokens only


def test_bypass_ppo_clip_clips_the_ratio_to_the_rollout_and_applies_no_weight_on_top():
    # A = 1, eps = 0.2: L = max(-rho, -clip(rho, 0.8, 1.2)) per token; rho = 3, 1 | 1, 1/4, 3/2
    loss, kept, stats, _ = bypass("ppo_clip", rollout_is="token")
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.0, 0.0], [-1.0, -0.25, -1.2]]))  # the IS weight (2 on rho = 3) is not applied
    assert stats["actor/pg_clipfrac"].tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]  # padding: 5.0 log ratio, masked by agg
    loss, kept, _, _ = bypass("ppo_clip", rollout_rs="token")
    assert torch.allclose(loss, torch.tensor([[0.0, -1.0, 0.0], [-1.0, 0.0, -1.2]]))


# verl's k-modes (rollout_corr_helper.compute_rollout_rejection_mask), written out per sequence in plain Python: with
# l = log rho clamped to +-20, k1 = -l, k2 = l^2 / 2, k3 = e^l - 1 - l per token; token_* judges each token, seq_sum /
# seq_mean / seq_max a sequence's sum / mean / max over its tokens. k1 keeps log(lower) <= value <= log(upper), k2 and
# k3 keep value <= upper; several modes keep a token only where all of them do.
def verl_reference(log_ratio, mask, modes):
    """modes: [(mode, lower or None, upper)] -> the kept mask as nested lists."""
    stats = {"k1": lambda l: -l, "k2": lambda l: 0.5 * l * l, "k3": lambda l: math.exp(l) - 1 - l}
    seq_of = {"seq_sum": sum, "seq_mean": lambda v: sum(v) / len(v), "seq_max": max}
    kept = []
    for row, row_mask in zip(log_ratio.tolist(), mask.tolist()):
        keep = [bool(m) for m in row_mask]
        for mode, lower, upper in modes:
            aggregation, statistic = mode.rsplit("_", 1)
            values = [stats[statistic](max(-20.0, min(20.0, l))) for l in row]
            passes = ((lambda v: math.log(lower) <= v <= math.log(upper)) if statistic == "k1" else (lambda v: v <= upper))
            if aggregation == "token":
                keep = [k and passes(v) for k, v in zip(keep, values)]
            elif any(row_mask):
                ok = passes(seq_of[aggregation]([v for v, m in zip(values, row_mask) if m]))
                keep = [k and ok for k in keep]
        kept.append([int(k) for k in keep])
    return kept


RANDOM_LOG_RATIO = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) * 0.4  # padding holds values too: they must not count
RANDOM_MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])  # one empty row
# per mode: the threshold as written in a config, and (lower, upper) as verl reads it; each rejects some rows or tokens
VERL_MODES = {
    "token_k1": ("0.8_1.3", 0.8, 1.3), "token_k2": (0.05, None, 0.05), "token_k3": ("0.05", None, 0.05),
    "seq_sum_k1": ("0.5_1.5", 0.5, 1.5), "seq_sum_k2": (0.3, None, 0.3), "seq_sum_k3": (0.3, None, 0.3),
    "seq_mean_k1": ("0.9_1.2", 0.9, 1.2), "seq_mean_k2": (0.05, None, 0.05), "seq_mean_k3": (0.05, None, 0.05),
    "seq_max_k2": (0.2, None, 0.2), "seq_max_k3": (0.2, None, 0.2),
}


def test_the_rs_modes_are_verls_aggregations_times_statistics():
    assert ROLLOUT_RS_STATISTICS.names() == ["k1", "k2", "k3"]
    assert ROLLOUT_RS_AGGREGATIONS.names() == ["seq_max", "seq_mean", "seq_sum", "token"]


@pytest.mark.parametrize("mode", sorted(VERL_MODES))
def test_each_verl_mode_matches_verls_formula(mode):
    threshold, lower, upper = VERL_MODES[mode]
    kept, m = rollout_rs_mask(RANDOM_LOG_RATIO, RANDOM_MASK, mode, threshold)
    expected = verl_reference(RANDOM_LOG_RATIO, RANDOM_MASK, [(mode, lower, upper)])
    assert kept.tolist() == expected and expected != RANDOM_MASK.tolist() and any(map(any, expected))
    rejected = sum(map(sum, RANDOM_MASK.tolist())) - sum(map(sum, expected))
    assert m["rollout_rs_masked_fraction"] == m[f"rollout_rs_{mode}_masked_fraction"] == pytest.approx(rejected / 14)
    assert {f"rollout_rs_{mode}_{k}" for k in ("mean", "max", "min", "fraction_high", "seq_masked_fraction")} <= m.keys()
    assert (f"rollout_rs_{mode}_fraction_low" in m) == mode.endswith("k1")  # only k1 has a lower bound


def test_k1_bands_bound_pi_rollout_over_pi_train_as_verl_does():
    # k1 = -log rho, so '0.7_1.6' keeps 0.7 <= pi_rollout / pi_train = 1 / rho <= 1.6: rho = 3 (1/3), 1/4 (4) and also
    # rho = 1.5 (1/rho = 0.67 < 0.7) are rejected, although 1.5 itself lies in [0.7, 1.6]
    kept, m = rollout_rs_mask(LOG_RATIO, MASK, "token_k1", "0.7_1.6")
    assert kept.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert (m["rollout_rs_token_k1_fraction_low"], m["rollout_rs_token_k1_fraction_high"]) == (pytest.approx(0.4), pytest.approx(0.2))
    # one number t is the band [1/t, t], the same both ways: rlcore's earlier names are these k1 modes
    for old, mode in (("token", "token_k1"), ("sequence", "seq_sum_k1"), ("geometric", "seq_mean_k1")):
        for t in (1.5, 2.5):
            old_mask = rollout_rs_mask(LOG_RATIO, MASK, old, t)[0]
            assert old_mask.tolist() == rollout_rs_mask(LOG_RATIO, MASK, mode, t)[0].tolist()
            assert old_mask.tolist() == rollout_rs_mask(LOG_RATIO, MASK, mode, f"{1 / t}_{t}")[0].tolist()


def test_seq_max_ignores_padding_and_one_spike_rejects_the_sequence():
    # k2 per valid token: ln(3)^2/2 = 0.60, 0 | 0, ln(4)^2/2 = 0.96, ln(1.5)^2/2 = 0.08; the padding's 5.0 (12.5) is not a token
    kept, m = rollout_rs_mask(LOG_RATIO, MASK, "seq_max_k2", 0.8)
    assert kept.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert m["rollout_rs_seq_max_k2_max"] == pytest.approx(math.log(4) ** 2 / 2)
    assert m["rollout_rs_seq_max_k2_min"] == pytest.approx(math.log(3) ** 2 / 2)
    assert m["rollout_rs_seq_max_k2_fraction_high"] == pytest.approx(0.5)  # counted in sequences: 1 of 2


def test_several_modes_reject_where_any_does_and_log_each():
    # verl's multi-mode example: token_k1 keeps 1/rho in [0.6, 1.6] -> [0, 1 | 1, 0, 1]; seq_max_k2 <= 0.8 rejects row 2
    kept, m = rollout_rs_mask(LOG_RATIO, MASK, "token_k1, seq_max_k2", "0.6_1.6,0.8")
    assert kept.tolist() == [[0, 1, 0], [0, 0, 0]]
    assert (m["rollout_rs_token_k1_masked_fraction"], m["rollout_rs_seq_max_k2_masked_fraction"]) == (pytest.approx(0.4), pytest.approx(0.6))
    assert (m["rollout_rs_masked_fraction"], m["rollout_rs_seq_masked_fraction"]) == (pytest.approx(0.8), 1.0)
    modes = ["token_k1", "seq_max_k2", "seq_mean_k3"]
    kept, _ = rollout_rs_mask(RANDOM_LOG_RATIO, RANDOM_MASK, ",".join(modes), ",".join(str(VERL_MODES[k][0]) for k in modes))
    assert kept.tolist() == verl_reference(RANDOM_LOG_RATIO, RANDOM_MASK, [(k, *VERL_MODES[k][1:]) for k in modes])
    # one threshold for all modes: 2.0 is [1/2, 2] for the k1 modes
    kept, _ = rollout_rs_mask(RANDOM_LOG_RATIO, RANDOM_MASK, "token_k1,seq_sum_k1", 2.0)
    assert kept.tolist() == verl_reference(RANDOM_LOG_RATIO, RANDOM_MASK, [("token_k1", 0.5, 2.0), ("seq_sum_k1", 0.5, 2.0)])


def test_rollout_correction_and_bypass_take_verls_mode_strings():
    _, mask, m = rollout_correction(OLD, ROLLOUT, MASK, "token", 2.0, "token_k1,seq_max_k2", "0.6_1.6,0.8")
    assert mask.tolist() == [[0, 1, 0], [0, 0, 0]] and m["rollout_corr/rollout_rs_seq_max_k2_mean"] == pytest.approx(
        (2 * math.log(3) ** 2 / 2 + 3 * math.log(4) ** 2 / 2) / 5)  # token mean of each sequence's max
    _, kept, _, grad = bypass("reinforce", rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,0.8")
    assert kept.tolist() == [[0, 1, 0], [0, 0, 0]] and torch.allclose(grad, -kept.float())


@pytest.mark.parametrize("rollout_rs, threshold, message", [
    ("token_k4", 2.0, "algorithm.rollout_correction.rollout_rs=token_k4 is not one of token_k1"),
    ("token_k1,seq_max_k2", "0.6_1.6,2.5,3", "has 3 thresholds for the 2 modes"),
    ("seq_max_k2", "0.5_2.5", "must be one positive upper bound"),
])
def test_bad_rules_raise_with_the_key(rollout_rs, threshold, message):
    with pytest.raises(ValueError, match=message):
        rollout_rs_mask(LOG_RATIO, MASK, rollout_rs, threshold)
