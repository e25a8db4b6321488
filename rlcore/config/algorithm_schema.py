"""The algorithm (`algorithm.*`): advantage estimator, KL control, DAPO's dynamic sampling, PF-PPO, the optimal
token baseline and rollout correction; the fields, then their rules.

This module imports neither torch nor ray.
"""

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Union


@dataclass
class KLControlConfig:
    """Coefficient schedule of the in-reward KL penalty (`algorithm.kl_ctrl.*`)."""

    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001  # (initial) coefficient
    horizon: int = 10000  # adaptive: steps over which the coefficient adapts
    target_kl: float = 0.1  # adaptive: KL the controller steers towards


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (`algorithm.filter_groups.*`, verl's DAPO recipe): groups whose samples all score the
    same carry no advantage signal; they are dropped and generation batches are drawn until train_batch_size
    prompts with differing scores are collected."""

    enable: bool = False  # filter groups and keep generating
    metric: Optional[str] = None  # what must differ within a group: acc | score | seq_reward | seq_final_reward
    max_num_gen_batches: int = 0  # generation batches per step at most before the run stops; <= 0 = no limit
    max_inflight_gen_batches: int = 1  # verl's bound on concurrent refill generation (train_batch_size units); >= 1


@dataclass
class RolloutCorrectionConfig:
    """Train-inference mismatch correction (`algorithm.rollout_correction.*`, rlcore/algos/rollout_corr.py). The
    mismatch metrics (`rollout_corr/*`) are logged every step whatever these say."""

    rollout_is: Optional[str] = None  # truncated importance sampling level: token | sequence; null = off
    # a number t: IS weights truncated at t (TIS; t is also the line of rollout_corr/ratio_fraction_*); verl 0.9's
    # string "lower_upper": weights outside [lower, upper] zeroed, those inside kept (IcePop). Any, as rollout_rs_threshold
    rollout_is_threshold: Any = 2.0
    rollout_rs: Optional[str] = None  # rejection modes, comma-separated: token_k1 ... seq_max_k3; null = off
    # needed with rollout_rs: one per mode, comma-separated ("0.6_1.6,2.5"), or one for all; a *_k1 mode takes a ratio
    # band "lower_upper" or a number t for [1/t, t], a *_k2/*_k3 mode an upper bound. Any: a number or a string
    # (OmegaConf has no Union[str, float]); its rules below parse and check it
    rollout_rs_threshold: Any = None
    bypass_mode: bool = False  # use the rollout's log-probs as the old log-probs (no old-log-prob pass)
    loss_type: str = "ppo_clip"  # bypass_mode loss: ppo_clip (PPO ratio to the rollout policy) | reinforce (-A w log pi)
    rollout_is_batch_normalize: bool = False  # divide the IS weights by their batch mean


@dataclass
class PFPPOConfig:
    """PF-PPO's sample weights (`algorithm.pf_ppo.*`), with use_pf_ppo."""

    reweight_method: str = "pow"  # pow | max_min | max_random
    weight_pow: float = 2.0  # pow: the weight is |score| ** weight_pow


@dataclass
class AlgorithmConfig:
    """Advantage estimation and in-reward KL (`algorithm.*`)."""

    gamma: float = 1.0  # discount factor
    lam: float = 1.0  # GAE lambda
    adv_estimator: str = "gae"  # registered estimator: gae (PPO, turns the critic on), grpo, rloo, remax, ...
    norm_adv_by_std_in_grpo: bool = True  # GRPO: divide by the group's std (False = Dr. GRPO)
    use_kl_in_reward: bool = False  # subtract a KL penalty from the reward; needs the ref model
    kl_penalty: str = "kl"  # KL estimator for the reward penalty; same choices as actor.kl_loss_type
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)  # coefficient schedule
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)  # DAPO dynamic sampling
    use_pf_ppo: bool = False  # PF-PPO: redraw the step's samples by their score after GAE (rlcore/algos/pf_ppo.py)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)  # its weighting
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # train-inference mismatch
    # GDPO (adv_estimator=gdpo): keys of the dict compute_score returns, one reward dimension each, normalised apart
    gdpo_reward_keys: Optional[List[str]] = None
    gdpo_reward_weights: Optional[List[float]] = None  # GDPO: each dimension's weight in the sum; null = all 1


# ---------------------------------------------------------------------------------------------------- rules
# Rules for verl's DAPO-recipe keys: dynamic sampling (`algorithm.filter_groups`, `data.gen_batch_size`) and the
# overlong buffer in its `reward_model.overlong_buffer` form. `c` is validate's checker (get / error).

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")  # verl's names; any scorer extra works too


def check_dynamic_sampling(c) -> None:
    train, gen = c.cfg.data.train_batch_size, c.cfg.data.gen_batch_size
    if not c.cfg.algorithm.filter_groups.enable:
        if gen != train and c.cfg.actor_rollout_ref.hybrid_engine is not False:  # split pools: prompts per rollout call
            c.error(f"data.gen_batch_size={gen} differs from data.train_batch_size={train} but only applies with DAPO's dynamic "
                    "sampling; set algorithm.filter_groups.enable=True, or drop data.gen_batch_size")
        return
    if c.cfg.algorithm.filter_groups.metric is None:
        c.error(f"algorithm.filter_groups.enable=True needs the value whose spread marks a useful group: set "
                f"algorithm.filter_groups.metric to one of {', '.join(FILTER_METRICS)} (acc: a key your compute_score returns)")
    n = c.cfg.actor_rollout_ref.rollout.n
    if n < 2:
        c.error(f"algorithm.filter_groups compares the scores within each prompt's group, and actor_rollout_ref.rollout.n={n} "
                "gives groups of one; use actor_rollout_ref.rollout.n=8 (or more than 1)")
    if gen is None or gen < 1:
        c.error(f"data.gen_batch_size={gen} must be >= 1; use data.gen_batch_size={train} (or a multiple, to waste fewer rounds)")
    inflight = c.cfg.algorithm.filter_groups.max_inflight_gen_batches
    if inflight < 1:  # verl refuses it too; rlcore's loop has one batch in flight whatever it says (key_status.py)
        c.error(f"algorithm.filter_groups.max_inflight_gen_batches={inflight} must be a positive integer; use 1")


# Rules for GDPO (`algorithm.adv_estimator=gdpo`, `algorithm.gdpo_reward_keys` / `gdpo_reward_weights`;
# rlcore/algos/advantages.py). `c` is validate's checker (get / error).

GDPO_KEYS, GDPO_WEIGHTS = "algorithm.gdpo_reward_keys", "algorithm.gdpo_reward_weights"


def check_gdpo(c) -> None:
    algo = c.cfg.algorithm
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    if algo.adv_estimator != "gdpo":
        for key, value in ((GDPO_KEYS, keys), (GDPO_WEIGHTS, weights)):
            if value is not None:
                c.error(f"{key}={list(value)} is read only by algorithm.adv_estimator=gdpo (here {algo.adv_estimator}); set "
                        f"algorithm.adv_estimator=gdpo, or drop {key}")
        return
    if not keys:
        c.error(f"algorithm.adv_estimator=gdpo normalises each reward dimension apart and needs their names: set {GDPO_KEYS} to "
                "keys of the dict your compute_score returns, e.g. +algorithm.gdpo_reward_keys='[accuracy_reward,format_reward]'")
    elif weights is not None and len(weights) != len(keys):
        c.error(f"{GDPO_WEIGHTS} has {len(weights)} weight(s) for the {len(keys)} key(s) of {GDPO_KEYS}={list(keys)}; give one "
                f"weight per key, or drop {GDPO_WEIGHTS} (all 1)")
    if algo.use_kl_in_reward:  # verl's GDPO reads only the components: the penalised reward would be computed and dropped
        c.error("algorithm.use_kl_in_reward=True with algorithm.adv_estimator=gdpo: GDPO's advantages come from the reward "
                "components alone, so the in-reward KL penalty would change nothing; use actor_rollout_ref.actor.use_kl_loss=True "
                "for a KL term, or use_kl_in_reward=False")
    if c.cfg.reward.reward_model.enable:
        c.error("algorithm.adv_estimator=gdpo reads the components from the dict compute_score returns, and with "
                "reward.reward_model.enable=True the reward model's single score replaces the rule scorer; use "
                "reward.reward_model.enable=False")


def check_overlong_buffer(c) -> None:
    if not c.cfg.reward_model.overlong_buffer.enable:
        return
    if c.cfg.reward.reward_manager.name != "dapo":
        c.error("reward_model.overlong_buffer.enable=True is DAPO's punishment; set reward.reward_manager.name=dapo")
    if (c.cfg.reward.reward_kwargs or {}).get("overlong_buffer_cfg"):
        c.error("the overlong buffer is set twice (reward_model.overlong_buffer and reward.reward_kwargs.overlong_buffer_cfg); "
                "keep one")
    buffer, max_len = c.cfg.reward_model.overlong_buffer.len, c.cfg.data.max_response_length
    if not 0 < buffer <= max_len:
        c.error(f"reward_model.overlong_buffer.len={buffer} must be in 1..data.max_response_length ({max_len}); "
                f"use reward_model.overlong_buffer.len={max(1, max_len // 4)}")


# Rules for the optimal token baseline (`algorithm.adv_estimator=optimal_token_baseline` and its multi-turn form;
# rlcore/algos/otb.py). `c` is validate's checker (get / error).

OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
SUM_PI_SQUARED = "actor_rollout_ref.actor.calculate_sum_pi_squared"


def check_otb(c) -> None:
    estimator = c.cfg.algorithm.adv_estimator
    if estimator not in OTB_ESTIMATORS:
        return
    if not c.get(SUM_PI_SQUARED):
        c.error(f"algorithm.adv_estimator={estimator} weighs each token by 1 - 2 pi + sum pi^2, and the sum comes from the "
                f"old-log-prob pass only when {SUM_PI_SQUARED}=True; set it (verl's OTB scripts do)")
    if c.cfg.algorithm.rollout_correction.bypass_mode:
        c.error(f"algorithm.adv_estimator={estimator} needs the old-log-prob pass (its log-probs and sum pi^2), which "
                "algorithm.rollout_correction.bypass_mode=True skips; use bypass_mode=False")


# Rules for PF-PPO (`algorithm.use_pf_ppo`, `algorithm.pf_ppo.*`; rlcore/algos/pf_ppo.py). `c` is validate's
# checker (get / error / choice).

REWEIGHT_METHODS = ("pow", "max_min", "max_random")


def check_pf_ppo(c) -> None:
    if not c.cfg.algorithm.use_pf_ppo:
        return
    c.choice("algorithm.pf_ppo.reweight_method", REWEIGHT_METHODS)
    estimator = c.cfg.algorithm.adv_estimator
    if estimator != "gae":
        # verl redraws the batch inside its GAE branch only: elsewhere the key would be accepted and do nothing
        c.error(f"algorithm.use_pf_ppo=True redraws the batch after GAE (verl's PF-PPO is part of its GAE path), so with "
                f"algorithm.adv_estimator={estimator} it would do nothing; use algorithm.adv_estimator=gae or drop use_pf_ppo")


# Rules for verl's train-inference mismatch correction (`algorithm.rollout_correction.*`, applied by
# rlcore/algos/rollout_corr.py). `c` is validate's checker (get / error / choice). Imports neither torch nor ray, so
# the level and mode names are repeated here; tests/config/test_algorithm_schema.py checks them against the algos
# registries. The rejection rules (`rollout_rs` + `rollout_rs_threshold`) are parsed here, once, for both sides.
#
# verl's rejection modes (rollout_corr_helper.py, SUPPORTED_ROLLOUT_RS_OPTIONS) are `<aggregation>_<statistic>`: a
# per-token statistic of log rho = log(pi_train / pi_rollout), k1 = -log rho, k2 = (log rho)^2 / 2,
# k3 = rho - 1 - log rho, judged per token (`token`) or per sequence by its sum, mean or max (`seq_sum`, `seq_mean`,
# `seq_max`). `rollout_rs` lists one or more, comma-separated; a token stays only where every mode keeps it.


RC = "algorithm.rollout_correction"
RS, RS_THRESHOLD = f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold"
IS_LEVELS = ("token", "sequence")
RS_MODES = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
            "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")  # verl has no seq_max_k1
# rlcore's names from before verl's k-modes, still accepted: each is the k1 mode at its level
RS_LEVELS = ("token", "sequence", "geometric")
LEGACY_RS_MODES = dict(zip(RS_LEVELS, ("token_k1", "seq_sum_k1", "seq_mean_k1")))
EXAMPLE_THRESHOLDS = {"k1": "0.5_2.0", "k2": "2.5", "k3": "0.01"}  # the values verl's docs show for each statistic
LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class RejectionRule:
    """One rollout_rs mode and its threshold: a token (or its whole sequence) is kept where the mode's value lies in
    [lower, upper]. k1 (signed) has a band on exp(value) = pi_rollout / pi_train, as verl compares -log rho with
    [log lower, log upper]; k2 and k3 (>= 0) have an upper bound only (lower is None)."""

    mode: str  # verl's name, e.g. seq_max_k2 (an earlier rlcore name is stored as its k1 mode)
    lower: Optional[float]
    upper: float

    @property
    def aggregation(self) -> str:  # token | seq_sum | seq_mean | seq_max
        return self.mode.rsplit("_", 1)[0]

    @property
    def statistic(self) -> str:  # k1 | k2 | k3
        return self.mode.rsplit("_", 1)[1]


def check_rollout_correction(c) -> None:
    rollout_is, rollout_rs = c.cfg.algorithm.rollout_correction.rollout_is, c.cfg.algorithm.rollout_correction.rollout_rs
    if rollout_is is not None:
        c.choice(f"{RC}.rollout_is", IS_LEVELS)
    if rollout_rs is not None:
        for problem in rejection_rules(rollout_rs, c.get(RS_THRESHOLD))[1]:
            c.error(problem)
    c.choice(f"{RC}.loss_type", LOSS_TYPES)
    for problem in is_threshold_band(c.cfg.algorithm.rollout_correction.rollout_is_threshold)[2]:
        c.error(problem)
    if c.cfg.algorithm.rollout_correction.rollout_is_batch_normalize and rollout_is is None:
        c.error(f"{RC}.rollout_is_batch_normalize=True normalises IS weights, but {RC}.rollout_is=null computes none; "
                f"set {RC}.rollout_is=token (or sequence), or drop rollout_is_batch_normalize")
    if rollout_is is not None and not c.cfg.algorithm.rollout_correction.bypass_mode and c.cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "geo_mean":
        # verl weighs GMPO's sequence loss by the geometric mean of the token weights; rlcore's weights scale tokens
        c.error(f"{RC}.rollout_is={rollout_is} with actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean (GMPO): its loss is "
                "per sequence and rlcore's IS weights are per token; use rollout_rs (rejection) or bypass_mode instead")
    if c.cfg.algorithm.rollout_correction.bypass_mode:
        _check_bypass(c, rollout_is)
    elif c.cfg.algorithm.rollout_correction.loss_type == "reinforce":
        c.error(f"{RC}.loss_type={c.cfg.algorithm.rollout_correction.loss_type} is bypass mode's loss and has no effect without it; set "
                f"{RC}.bypass_mode=True, or {RC}.loss_type=ppo_clip")


def rollout_correction_warnings(cfg) -> list[str]:
    """What verl runs with no effect, said before the run (rlcore.config.validate.config_warnings)."""
    rc = cfg.algorithm.rollout_correction
    warnings = []
    if rc.bypass_mode and rc.rollout_is is not None and rc.loss_type == "ppo_clip":
        warnings.append(f"{RC}.rollout_is={rc.rollout_is} has no effect with bypass_mode and loss_type=ppo_clip (the PPO ratio "
                        f"to the rollout policy already is the importance weight; verl computes the weights and does not "
                        f"apply them either); {RC}.loss_type=reinforce applies them")
    if rc.bypass_mode and rc.rollout_is_batch_normalize and rc.rollout_is is not None and rc.loss_type == "reinforce":
        warnings.append(f"{RC}.rollout_is_batch_normalize=True in bypass mode divides the IS weights by their mean over each "
                        f"micro-batch on its rank (verl: over that micro-batch on every data-parallel rank), so the "
                        f"micro-batch size changes the update; bypass_mode=False normalises over the whole batch")
    return warnings


def _check_bypass(c, rollout_is) -> None:
    """bypass_mode replaces the policy loss (rlcore.algos.rollout_corr.bypass_mode_loss), as in verl."""
    mode = c.cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode != "vanilla":
        c.error(f"{RC}.bypass_mode=True uses PPO's clipped loss (or loss_type=reinforce) in place of "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}; use loss_mode=vanilla, or bypass_mode=False")


def is_threshold_band(spec: Union[str, float, None]) -> tuple[Optional[float], float, list[str]]:
    """(lower or None, upper, every problem as one line with its fix) of `rollout_is_threshold` as verl 0.9 reads it:
    a number t truncates IS weights at t; a string "lower_upper" keeps the weights inside [lower, upper] and zeroes
    the rest (IcePop); a numeric string is the number."""
    key = f"{RC}.rollout_is_threshold"
    lower, upper = None, spec
    try:
        if isinstance(spec, str) and "_" in spec:
            lower, upper = (float(part) for part in spec.strip().split("_", 1))
        elif isinstance(spec, (str, int, float)) and not isinstance(spec, bool):
            upper = float(spec)
        else:
            raise ValueError
    except ValueError:
        return None, 2.0, [f"{key}={spec!r} is not a number or a band \"lower_upper\"; use {key}=2.0 (truncation) or "
                           f"{key}=0.5_2.0 (IcePop)"]
    if lower is None and upper <= 1:  # at or below 1 every ratio above 1 is truncated and the band is empty
        return None, 2.0, [f"{key}={spec} must be > 1 (IS weights are truncated there, and ratios past it or below its "
                           f"inverse are counted); use {key}=2.0"]
    if lower is not None and not 0 < lower <= upper:
        return None, 2.0, [f"{key}={spec}: a band lower_upper needs 0 < lower <= upper; use {key}=0.5_2.0"]
    return lower, upper, []


def rejection_rules(rollout_rs: str, threshold: Union[str, float, None]) -> tuple[list[RejectionRule], list[str]]:
    """(the rules, every problem as one line with its fix) of `rollout_rs` and `rollout_rs_threshold`, as verl reads
    them: comma-separated modes; thresholds comma-separated, one per mode in the same order or one for all. A k1
    threshold is `lower_upper` (ratio bounds) or one number t for [1/t, t]; a k2/k3 threshold is one upper bound."""
    if not isinstance(rollout_rs, str):
        return [], [f"{RS}={rollout_rs!r} must be a string of comma-separated modes; use {RS}=token_k1 (valid: {', '.join(RS_MODES)})"]
    names = [name.strip() for name in rollout_rs.split(",") if name.strip()]
    problems = _mode_problems(rollout_rs, names)
    if not names or problems:
        return [], problems
    modes = [LEGACY_RS_MODES.get(name, name) for name in names]
    example = ",".join(EXAMPLE_THRESHOLDS[mode[-2:]] for mode in modes)
    if threshold is None:
        if len(modes) == 1 and modes[0].endswith("k1"):
            return [], [f"{RS}={rollout_rs} keeps the ratios in [1/rollout_rs_threshold, rollout_rs_threshold], but "
                        f"{RS_THRESHOLD}=None; use {RS_THRESHOLD}=2.0 (it must be > 1)"]
        return [], [f"{RS}={rollout_rs} needs a threshold per mode, but {RS_THRESHOLD}=None; use {RS_THRESHOLD}='{example}' "
                    f"({_threshold_forms()})"]
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        return [], [f"{RS_THRESHOLD}={threshold!r} must be a number or a string of comma-separated thresholds; "
                    f"use {RS_THRESHOLD}='{example}'"]
    specs = [str(threshold)] if not isinstance(threshold, str) else [s.strip() for s in threshold.split(",") if s.strip()]
    if len(specs) not in (1, len(modes)):
        return [], [f"{RS_THRESHOLD}='{threshold}' has {len(specs)} thresholds for the {len(modes)} modes of {RS}={rollout_rs}; "
                    f"give one per mode in the same order (or one for all), e.g. {RS_THRESHOLD}='{example}'"]
    rules = []
    for mode, spec in zip(modes, specs * len(modes) if len(specs) == 1 else specs):
        rule, problem = _rule(mode, spec, threshold)
        rules.append(rule)
        problems += [problem] if problem else []
    return ([] if problems else rules), problems


def parse_rejection_rules(rollout_rs: str, threshold: Union[str, float, None]) -> list[RejectionRule]:
    """rejection_rules, or ValueError with every problem (validate_config reports them before a run starts)."""
    rules, problems = rejection_rules(rollout_rs, threshold)
    if problems:
        raise ValueError("; ".join(problems))
    return rules


def _mode_problems(rollout_rs: str, names: list[str]) -> list[str]:
    valid = RS_MODES + RS_LEVELS
    if not names:
        return [f"{RS}='{rollout_rs}' names no mode; use {RS}=null to turn rejection off, or one of {', '.join(RS_MODES)}"]
    problems = []
    for name in names:
        if name not in valid:
            # the closest name, the first of a tie (seq_max_k1 -> seq_max_k2, token_kl -> token_k1)
            close = max(valid, key=lambda v: difflib.SequenceMatcher(None, name, v).ratio())
            close = close if difflib.SequenceMatcher(None, name, close).ratio() >= 0.6 else "token_k1"
            fixed = ",".join(close if n == name else n for n in names)
            which = f"{RS}={rollout_rs}" + (f": {name}" if len(names) > 1 else "")
            problems.append(f"{which} is not one of {', '.join(RS_MODES)} (or rlcore's earlier {', '.join(RS_LEVELS)}); "
                            f"use {RS}={fixed}")
    modes = [LEGACY_RS_MODES.get(name, name) for name in names]
    twice = sorted({mode for mode in modes if modes.count(mode) > 1})
    if twice:
        problems.append(f"{RS}={rollout_rs} lists {', '.join(twice)} more than once (token, sequence and geometric are "
                        f"token_k1, seq_sum_k1 and seq_mean_k1); list each mode once, with its own threshold")
    return problems


def _threshold_forms() -> str:
    return ("each *_k1 takes a ratio band 'lower_upper' or one number t > 1 for [1/t, t]; each *_k2 / *_k3 one positive "
            "upper bound")


def _rule(mode: str, spec: str, threshold) -> tuple[Optional[RejectionRule], Optional[str]]:
    """The rule of one mode and its threshold text, or the problem with it."""
    where = f"{RS_THRESHOLD}={threshold!r}: {mode}'s threshold '{spec}'"
    if mode.endswith("k1"):
        band = "_" in spec
        lower_text, _, upper_text = spec.partition("_") if band else ("", "", spec)
        lower, upper = _number(lower_text), _number(upper_text)
        if upper is None or (band and lower is None):
            return None, f"{where} is not a number or a 'lower_upper' band; use e.g. '0.5_2.0' ({_threshold_forms()})"
        if not band:  # one number t: the band [1/t, t]
            if not upper > 1:
                # a band written 0.5_2 without quotes and a decimal point is a number to YAML and Hydra (0.52)
                hint = " (an unquoted 0.5_2 reads as the number 0.52: write '0.5_2.0')" if 0 < upper < 1 else ""
                return None, f"{where} keeps the ratios in [1/{spec}, {spec}], which is empty{hint}; use a number > 1, e.g. 2.0"
            return RejectionRule(mode, 1 / upper, upper), None
        if not (lower > 0 and upper > lower):
            return None, f"{where} must be a band 0 < lower < upper of ratios; use e.g. '0.5_2.0'"
        return RejectionRule(mode, lower, upper), None
    upper = None if "_" in spec else _number(spec)
    if upper is None or not upper > 0:
        return None, (f"{where} must be one positive upper bound on the {mode[-2:]} divergence (a 'lower_upper' band is for "
                      f"*_k1 modes only); use e.g. '{EXAMPLE_THRESHOLDS[mode[-2:]]}'")
    return RejectionRule(mode, None, upper), None


def _number(text: str) -> Optional[float]:
    """A finite number, or None ("_" is Python's digit separator: "2_3" would read as 23)."""
    try:
        value = float(text) if "_" not in text else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
