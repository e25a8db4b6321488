"""The policy's math over a TrainEngine: log-probs for a batch, and the PPO/GRPO update. Backend-neutral."""

from __future__ import annotations

from typing import Callable

import torch

from rlcore.algos import POLICY_LOSSES, agg_loss, kl_penalty
from rlcore.algos.agg import statistic_mode
from rlcore.algos.distill import ESTIMATORS, combined_loss, distillation_loss, token_losses
from rlcore.algos.rollout_corr import bypass_mode_loss, mismatch_token_terms
from rlcore.config.algorithm_schema import RolloutCorrectionConfig, is_threshold_band
from rlcore.config.typed import plain
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import LossFn, TokenRequest, TrainEngine
from rlcore.models.router import ROUTES
from rlcore.protocol import DataProto
from rlcore.workers.common import run_forward, run_ppo_updates


def compute_log_prob(engine: TrainEngine, data: DataProto, micro: MicroBatchSpec, temperature: float, with_entropy: bool,
                     routes: str = "free", with_sum_pi_squared: bool = False) -> DataProto:
    """Log-prob (and entropy, and sum_v p(v)^2) of every response token: `[batch, response_len]` columns `log_probs`
    / `entropys` / `sum_pi_squared`. A mixture of experts (rlcore.engine.base.TokenRequest.routes): "record" adds
    `routed_experts` `[batch, seq, layers, top_k]`; "replay" forces the batch's, when it has them."""
    if routes == "replay" and ROUTES not in data.batch.keys():
        routes = "free"  # R2 with an on-policy update: no old-log-prob pass recorded any

    def fn(outputs: dict[str, torch.Tensor], mb: DataProto) -> dict[str, torch.Tensor]:
        out = {"log_probs": outputs["log_probs"]}
        if with_entropy:
            out["entropys"] = outputs["entropy"]
        if with_sum_pi_squared:
            out["sum_pi_squared"] = outputs["sum_pi_squared"]
        if routes == "record":
            out[ROUTES] = outputs[ROUTES]
        return out

    return run_forward(engine, data, micro, fn, TokenRequest(temperature, with_entropy, routes, with_sum_pi_squared))


def policy_loss_params(actor_cfg) -> dict[str, float]:
    """Every knob a registered policy loss may take; each loss picks the ones it uses (and ignores the rest)."""
    params = {k: getattr(actor_cfg, k) for k in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")}
    params.update({k: getattr(actor_cfg, k) for k in ("tau_pos", "tau_neg") if hasattr(actor_cfg, k)})  # SAPO's (a loss's own defaults else)
    # a policy_loss knob left unset (None) keeps the actor's or the loss's own: verl 0.9's SAPO scripts add
    # policy_loss.tau_pos / tau_neg beside the actor's tau_pos / tau_neg
    params.update({k: v for k, v in plain(actor_cfg.policy_loss).items() if k != "loss_mode" and v is not None})
    return params


def make_policy_loss_fn(actor_cfg, counts: tuple[float, float], dp_size: int, on_policy: bool = False,
                        rollout_corr: RolloutCorrectionConfig | None = None, distill=None) -> LossFn:
    """The per-micro-batch loss: policy loss - entropy_coeff * entropy (+ kl_loss_coef * KL to the reference).

    `counts` = (valid tokens, sequences) of the whole mini-batch over all ranks: the normalisers that make the
    sum of micro-batch losses equal the mini-batch loss (rlcore.algos.agg). `on_policy`: the batch was sampled by
    exactly these weights and this is their only update, so the old log-probs are this forward's own (detached;
    ratio 1, the gradient of the log-probs) and actor/entropy, which no old-log-prob pass measured, is logged here.
    Rollout correction (`rollout_corr`: algorithm.rollout_correction): `rollout_is_weights` in the batch scale each
    token's policy loss (verl's truncated IS, computed by the controller); with bypass_mode the old log-probs are
    the rollout's and the loss is rlcore.algos.rollout_corr.bypass_mode_loss; `rollout_log_probs` in the batch (no
    old-log-prob pass ran: on-policy or bypass_mode) ask for the token-mean `rollout_corr/*` mismatch metrics
    against this forward's log-probs.
    `distill` (distillation.distillation_loss when distillation is on): the distillation term against the batch's
    teacher columns joins the policy loss as verl combines them (rlcore.algos.distill); entropy, KL and a MoE's
    auxiliary loss stay as configured.
    """
    rc = rollout_corr or RolloutCorrectionConfig()
    ratio_line = is_threshold_band(rc.rollout_is_threshold)[1]  # the mismatch metrics' ratio_fraction_* line
    policy_loss = POLICY_LOSSES.get(actor_cfg.policy_loss.loss_mode)
    loss_params = policy_loss_params(actor_cfg)
    # A loss defined per sequence (GMPO) fixes its own aggregation; the others (and bypass mode's) follow loss_agg_mode
    pg_mode = actor_cfg.loss_agg_mode if rc.bypass_mode else getattr(policy_loss, "loss_agg_mode", actor_cfg.loss_agg_mode)
    stats_mode = statistic_mode(actor_cfg.loss_agg_mode)
    scale = actor_cfg.loss_scale_factor  # seq-mean-token-sum-norm's divisor (verl 0.9); None = the response width

    def loss_fn(outputs: dict[str, torch.Tensor], mb: DataProto) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        log_prob = outputs["log_probs"]
        b = {k: v.to(log_prob.device) for k, v in mb.batch.items()}
        mask = b["response_mask"]
        agg = lambda mat: agg_loss(mat, mask, actor_cfg.loss_agg_mode, counts[0], counts[1], dp_size, scale)  # noqa: E731
        old_log_prob = log_prob.detach() if on_policy else b["old_log_probs"]
        extra = {}
        if rc.bypass_mode:
            pg_mat, kept, stats = bypass_mode_loss(old_log_prob, log_prob, b["advantages"], mask, rc.loss_type, rc.rollout_is,
                                                   rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold,
                                                   rc.rollout_is_batch_normalize, **loss_params)
            if rc.rollout_rs is not None:
                extra["rollout_corr/rollout_rs_masked_fraction"] = (mask - kept).float()
        else:
            pg_mat, stats = policy_loss(old_log_prob, log_prob, b["advantages"], mask, **loss_params)
            if "rollout_is_weights" in b:  # detached weights, applied after clipping, as verl does for every loss mode
                pg_mat = pg_mat * b["rollout_is_weights"]
        pg_loss = agg_loss(pg_mat, mask, pg_mode, counts[0], counts[1], dp_size, scale)
        loss = pg_loss
        # Metrics stay on the device (detached): run_ppo_updates reads a mini-batch's in one transfer, not one
        # host sync per metric per micro-batch.
        metrics = {"actor/pg_loss": pg_loss.detach()}
        if distill is not None:
            loss, distill_metrics = _distillation_term(distill, outputs, b, mask, log_prob, old_log_prob, agg, pg_loss)
            metrics.update(distill_metrics)
        if actor_cfg.entropy_coeff != 0:
            entropy = agg(outputs["entropy"])
            loss = loss - actor_cfg.entropy_coeff * entropy
            metrics["actor/entropy"] = entropy.detach()
        elif on_policy:  # not in the loss: the batch's token mean, as the skipped old-log-prob pass would report it
            token_mean = agg_loss(outputs["entropy"].detach(), mask, "token-mean", counts[0], counts[1], dp_size)
            metrics["actor/entropy"] = token_mean
        if on_policy and "rollout_log_probs" in b:
            # The rollout engine's log-probs of the tokens it sampled against this forward's (same weights): a
            # diverging engine (wrong weights, temperature or kernels) shows here, though the loss uses its own.
            gap = (log_prob.detach() - b["rollout_log_probs"]).abs()
            metrics["rollout/log_prob_abs_diff"] = agg_loss(gap, mask, "token-mean", counts[0], counts[1], dp_size)
        if actor_cfg.use_kl_loss:
            kl_loss = agg(kl_penalty(log_prob, b["ref_log_prob"], actor_cfg.kl_loss_type))
            loss = loss + actor_cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        if "router_aux_loss" in outputs:  # a MoE's load-balancing loss (HF's, when its config asks for it)
            aux = agg(outputs["router_aux_loss"].expand_as(log_prob))
            loss = loss + aux
            metrics["actor/moe/aux_loss"] = aux.detach()
        metrics.update({k: agg_loss(v, mask, stats_mode, counts[0], counts[1], dp_size).detach() for k, v in stats.items()})
        if "rollout_log_probs" in b:  # token means as shares of the mini-batch, exact after the usual sum and mean
            terms = mismatch_token_terms(log_prob, b["rollout_log_probs"], ratio_line)
            for key, mat in {**{f"rollout_corr/{k}": v for k, v in terms.items()}, **extra}.items():
                metrics[key] = agg_loss(mat, mask, "token-mean", counts[0], counts[1], dp_size).detach()
        return loss, metrics

    return loss_fn


def _distillation_term(distill, outputs: dict, b: dict, mask: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                       agg: Callable, pg_loss: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The policy loss combined with the distillation term, and `actor/distillation/*` metrics (verl's names): the
    loss, its per-token extremes over this micro-batch (reduced by min / max, rlcore.controller.decorator), and the
    loss's own statistics as token means."""
    per_token, stats = token_losses(distill, outputs, b)
    valid = per_token.detach()[mask.bool()]
    term, pg_stats = distillation_loss(distill, per_token, mask, log_prob, old_log_prob, agg)
    metrics = {"actor/distillation/loss": term.detach(),
               "actor/distillation/loss_min": valid.min() if valid.numel() else 0.0,
               "actor/distillation/loss_max": valid.max() if valid.numel() else 0.0}
    metrics.update({f"actor/distillation/{k}": agg(v).detach() for k, v in {**stats, **pg_stats}.items()})
    return combined_loss(distill, pg_loss, term), metrics


def distillation_request(distill, vocab_size: int) -> dict:
    """What the student's forward adds for the distillation loss (rlcore.engine.base.TokenRequest): for the top-k
    losses its log-probs at the teacher's top-k ids (with gradient) and its own top-k ids (the overlap metric; a
    topk beyond the vocabulary is the whole vocabulary, as the teacher's)."""
    if distill is None or distill.loss_mode in ESTIMATORS:
        return {}
    return {"gather": "teacher_topk_ids", "topk": min(distill.topk, vocab_size)}


def update_policy(engine: TrainEngine, data: DataProto, actor_cfg, micro: MicroBatchSpec, rollout_n: int, temperature: float,
                  rollout_corr: RolloutCorrectionConfig | None = None, distill=None) -> dict[str, float]:
    """ppo_epochs x mini-batches x micro-batches of the configured loss, one optimizer step per mini-batch. A mixture
    of experts replays the batch's `routed_experts` (router replay R2/R3) and reports its routers' load.

    `data` is this rank's share; a mini-batch is `ppo_mini_batch_size * rollout.n / dp_size` of its rows.
    `data.meta_info["on_policy"]` is the controller's decision (rlcore.trainer.ppo) that the update is exactly
    on-policy, so it skipped the old-log-prob pass: the loss uses its own log-probs, detached (make_policy_loss_fn).
    """
    mini_batch_rows = actor_cfg.ppo_mini_batch_size * rollout_n // engine.dp_size
    on_policy = bool(data.meta_info.get("on_policy", False))  # absent: a caller that ran the pass
    if on_policy == ("old_log_probs" in data.batch.keys()):
        raise ValueError(f"meta_info on_policy={on_policy} but old_log_probs are {'' if on_policy else 'not '}in the batch: "
                         "an on-policy update uses its own log-probs as the old ones, any other needs them")
    if on_policy and (actor_cfg.ppo_epochs != 1 or len(data) != mini_batch_rows):
        raise ValueError(f"an on-policy update of {actor_cfg.ppo_epochs} epoch(s) x {len(data) // mini_batch_rows} mini-batches: "
                         "only a single on-policy step may use its own log-probs as the old ones")
    # Entropy only where it is used: in the loss, or as the metric the skipped old-log-prob pass would have logged.
    replay = actor_cfg.router_replay.mode != "disabled" and ROUTES in data.batch.keys()
    request = TokenRequest(temperature, entropy=actor_cfg.entropy_coeff != 0 or on_policy, routes="replay" if replay else "free",
                           **distillation_request(distill, engine.hf_config.get_text_config().vocab_size))
    metrics = run_ppo_updates(
        engine, data, actor_cfg.ppo_epochs, mini_batch_rows, micro,
        lambda counts: make_policy_loss_fn(actor_cfg, counts, engine.dp_size, on_policy, rollout_corr, distill), "actor", request,
        shuffle_seed=actor_cfg.data_loader_seed if actor_cfg.shuffle else None,
    )
    return metrics | {f"actor/{k}": v for k, v in engine.moe_metrics().items()}
