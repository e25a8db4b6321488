"""On-policy distillation's losses (verl's `distillation.distillation_loss.*`, docs/algo/opd.md): per-token divergences
of the student (the policy, on its own samples) from a teacher, and how they join the actor's loss.

Notation per response token t: q = the student's distribution, p = the teacher's, both softmax(logits / T) at the
rollout's temperature; a_t the sampled token. Shapes: `[batch, response_len]` per token, `[batch, response_len, K]`
for the teacher's top-k tokens. Every function is pure; rlcore.workers.actor calls `distillation_loss`.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlcore.algos.kl import kl_penalty
from rlcore.algos.policy_loss import POLICY_LOSSES
from rlcore.algos.registry import Registry

# name -> fn(student_log_probs, teacher, ...) -> (per-token loss, per-token stats)
DISTILL_LOSSES = Registry("distillation loss", "distillation.distillation_loss.loss_mode")
ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _estimator(mode: str) -> Callable:
    def loss(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, **_) -> tuple[torch.Tensor, dict]:
        """verl's single-sample estimators of reverse KL(q || p) at the sampled token, with r = log q(a) - log p(a):
        k1 = r; abs = |r|; k2 (mse) = r^2 / 2; k3 (low_var_kl) = exp(-r) + r - 1 (clamped to [-10, 10], as the KL
        penalty's). k1's gradient does not depend on p, so it only distils as a policy-gradient reward."""
        losses = kl_penalty(student_log_probs, teacher_log_probs, mode)
        return losses, {"abs_loss": losses.detach().abs()}

    return loss


for _mode in ESTIMATORS:
    DISTILL_LOSSES.register(_mode)(_estimator(_mode))


def _topk_terms(student_topk: torch.Tensor, teacher_topk: torch.Tensor, log_prob_min_clamp: float | None) -> tuple[torch.Tensor, ...]:
    """(sum_i p_i (log p_i - log q_i) over the teacher's top-k, the student's and the teacher's top-k mass). The
    log-probs in the sum are floored at log_prob_min_clamp (a token one model all but rules out would otherwise
    dominate); the masses are of the unfloored ones."""
    student_mass, teacher_mass = student_topk.exp().sum(-1), teacher_topk.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student_topk, teacher_topk = student_topk.clamp_min(log_prob_min_clamp), teacher_topk.clamp_min(log_prob_min_clamp)
    kl = (teacher_topk.exp() * (teacher_topk - student_topk)).sum(-1)
    return kl, student_mass, teacher_mass


@DISTILL_LOSSES.register("forward_kl_topk")
def forward_kl_topk(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, log_prob_min_clamp: float | None = None,
                    **_) -> tuple[torch.Tensor, dict]:
    """Forward KL(p || q) over the teacher's top-k tokens S: sum_{i in S} p_i (log p_i - log q_i), floored at 0 (the
    truncated sum of a KL can dip below it). Its gradient moves every top-k logit, not only the sampled one."""
    kl, student_mass, teacher_mass = _topk_terms(student_topk_log_probs, teacher_topk_log_probs, log_prob_min_clamp)
    return kl.clamp_min(0.0), _mass_stats(student_mass, teacher_mass)


@DISTILL_LOSSES.register("forward_kl_topk_tail")
def forward_kl_topk_tail(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, log_prob_min_clamp: float | None = None,
                         tail_mass_eps: float = 1e-7, **_) -> tuple[torch.Tensor, dict]:
    """Forward KL over the teacher's top-k tokens plus one bucket for the rest of the vocabulary (the exact KL of the
    coarse-grained distributions, so >= 0 up to rounding): forward_kl_topk's sum + p_tail (log p_tail - log q_tail),
    p_tail = 1 - sum_S p, q_tail = max(1 - sum_S q, tail_mass_eps). Only the student's tail is guarded (it is inside
    a log); a teacher tail of 0 contributes 0 (x log x -> 0)."""
    kl, student_mass, teacher_mass = _topk_terms(student_topk_log_probs, teacher_topk_log_probs, log_prob_min_clamp)
    teacher_tail = (1.0 - teacher_mass).clamp(0.0, 1.0)
    student_tail = (1.0 - student_mass).clamp(tail_mass_eps, 1.0)
    safe_teacher_tail = teacher_tail.clamp_min(torch.finfo(teacher_tail.dtype).tiny)  # 0 * log(tiny) = 0, not nan
    tail = teacher_tail * (safe_teacher_tail.log() - student_tail.log())
    return (kl + tail).clamp_min(0.0), _mass_stats(student_mass, teacher_mass)


def _mass_stats(student_mass: torch.Tensor, teacher_mass: torch.Tensor) -> dict[str, torch.Tensor]:
    student_mass, teacher_mass = student_mass.detach(), teacher_mass.detach()
    return {"student_mass": student_mass, "teacher_mass": teacher_mass,
            "student_tail_mass": 1.0 - student_mass, "teacher_tail_mass": 1.0 - teacher_mass}


def overlap_ratio(student_topk_ids: torch.Tensor, teacher_topk_ids: torch.Tensor) -> torch.Tensor:
    """Per token, the share of the teacher's top-k ids that are also among the student's top-k: how much of the
    teacher's preferred next tokens the student already ranks highly (`[batch, response_len]`)."""
    shared = (teacher_topk_ids[..., :, None] == student_topk_ids[..., None, :]).any(-1)
    return shared.float().mean(-1)


def token_losses(loss_cfg, outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The configured per-token loss `[batch, response_len]` and its per-token stats, from the student's forward
    (`outputs`: log_probs, and for the top-k losses gathered_log_probs at the teacher's ids, topk_ids its own top-k)
    and the teacher's columns (`batch`: teacher_log_probs, teacher_topk_log_probs)."""
    fn = DISTILL_LOSSES.get(loss_cfg.loss_mode)
    if loss_cfg.loss_mode in ESTIMATORS:
        return fn(outputs["log_probs"], batch["teacher_log_probs"])
    losses, stats = fn(outputs["gathered_log_probs"], batch["teacher_topk_log_probs"], log_prob_min_clamp=loss_cfg.log_prob_min_clamp,
                       tail_mass_eps=loss_cfg.tail_mass_eps)
    if "topk_ids" in outputs:
        stats["overlap_ratio"] = overlap_ratio(outputs["topk_ids"], batch["teacher_topk_ids"])
    return losses, stats


def distillation_loss(loss_cfg, losses: torch.Tensor, mask: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                      agg: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation term of the actor's loss, and its metrics (before `agg`: per-token matrices).

    The per-token losses are clamped to [-loss_max_clamp, loss_max_clamp]. With use_policy_gradient (Thinking
    Machines' on-policy distillation) their negative is each token's advantage in the vanilla PPO-clip loss,
    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), r = exp(log q - log q_old), A = -loss (detached): a token
    the teacher finds likelier than the student is pushed up. Otherwise (GKD) the clamped losses are aggregated
    and backpropagated directly. `agg`: the actor's loss aggregation over this micro-batch (loss_agg_mode)."""
    if loss_cfg.loss_max_clamp is not None:
        losses = losses.clamp(-loss_cfg.loss_max_clamp, loss_cfg.loss_max_clamp)
    if not loss_cfg.use_policy_gradient:
        return agg(losses), {}
    pg = POLICY_LOSSES.get(loss_cfg.policy_loss_mode)
    pg_mat, stats = pg(old_log_prob, log_prob, -losses.detach(), mask, clip_ratio_low=loss_cfg.clip_ratio_low,
                       clip_ratio_high=loss_cfg.clip_ratio_high)
    return agg(pg_mat), {key.replace("actor/", ""): value for key, value in stats.items()}


def combined_loss(loss_cfg, policy_loss: torch.Tensor, distill: torch.Tensor) -> torch.Tensor:
    """verl's combination: with use_task_rewards, policy loss + distillation_loss_coef x distillation; without, the
    distillation loss alone (the task rewards' policy loss is dropped)."""
    if loss_cfg.use_task_rewards:
        return policy_loss + loss_cfg.distillation_loss_coef * distill
    return distill
