"""On-policy distillation's losses (rlcore.algos.distill) against direct computations over the whole vocabulary,
values and gradients."""

from types import SimpleNamespace

import pytest
import torch

from rlcore.algos.distill import (
    DISTILL_LOSSES,
    ESTIMATORS,
    combined_loss,
    distillation_loss,
    forward_kl_topk,
    forward_kl_topk_tail,
    overlap_ratio,
    token_losses,
)

B, R, V = 3, 4, 11


def loss_cfg(**kw):
    base = dict(loss_mode="k3", topk=V, use_task_rewards=True, distillation_loss_coef=1.0, loss_max_clamp=None,
                log_prob_min_clamp=None, tail_mass_eps=1e-7, use_policy_gradient=False, policy_loss_mode="vanilla",
                clip_ratio_low=0.2, clip_ratio_high=0.2)
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, R, V, generator=g, dtype=torch.float64), torch.randn(B, R, V, generator=g, dtype=torch.float64)


def test_every_verl_loss_mode_is_registered():
    assert set(DISTILL_LOSSES.names()) == set(ESTIMATORS) | {"forward_kl_topk", "forward_kl_topk_tail"}


@pytest.mark.parametrize("mode,direct,grad", [
    ("k1", lambda r: r, lambda r: torch.ones_like(r)),
    ("abs", lambda r: r.abs(), lambda r: r.sign()),
    ("k2", lambda r: 0.5 * r * r, lambda r: r),
    ("k3", lambda r: torch.exp(-r) + r - 1, lambda r: 1 - torch.exp(-r)),
])
def test_estimators_are_verls_formulas_in_value_and_gradient(mode, direct, grad):
    """r = log q(a) - log p(a); d loss / d log q is the formula's derivative in r (k3's clamp at 10 not reached)."""
    g = torch.Generator().manual_seed(1)
    student = (0.5 * torch.randn(B, R, generator=g, dtype=torch.float64)).requires_grad_()
    teacher = 0.5 * torch.randn(B, R, generator=g, dtype=torch.float64)
    losses, stats = DISTILL_LOSSES.get(mode)(student, teacher)
    r = (student - teacher).detach()
    torch.testing.assert_close(losses.detach(), direct(r))
    losses.sum().backward()
    torch.testing.assert_close(student.grad, grad(r))
    torch.testing.assert_close(stats["abs_loss"], direct(r).abs())


def test_forward_kl_over_the_whole_vocabulary_is_the_exact_kl_and_its_gradient_is_q_minus_p(logits):
    """With k = V the top-k sum is KL(p || q) itself, and d KL / d student logits = q - p."""
    student_logits, teacher_logits = logits
    student_logits = student_logits.clone().requires_grad_()
    q, p = student_logits.log_softmax(-1), teacher_logits.log_softmax(-1)
    top_p, ids = p.topk(V, -1)
    losses, stats = forward_kl_topk(q.gather(-1, ids), top_p)
    exact = (p.exp() * (p - q)).sum(-1)
    torch.testing.assert_close(losses, exact)
    losses.sum().backward()
    torch.testing.assert_close(student_logits.grad, (q.exp() - p.exp()).detach())
    torch.testing.assert_close(stats["teacher_mass"], torch.ones(B, R, dtype=torch.float64))


def test_the_tail_bucket_makes_the_kl_of_the_coarse_grained_distributions(logits):
    """k < V: exactly KL((p_S, p_tail) || (q_S, q_tail)), between 0 and the full KL (coarse-graining never raises a
    KL); forward_kl_topk alone is that without the tail term."""
    student_logits, teacher_logits = logits
    q, p = student_logits.log_softmax(-1), teacher_logits.log_softmax(-1)
    top_p, ids = p.topk(3, -1)
    top_q = q.gather(-1, ids)
    tail_p, tail_q = 1 - top_p.exp().sum(-1), 1 - top_q.exp().sum(-1)
    coarse = (top_p.exp() * (top_p - top_q)).sum(-1) + tail_p * (tail_p.log() - tail_q.log())
    with_tail, stats = forward_kl_topk_tail(top_q, top_p)
    torch.testing.assert_close(with_tail, coarse)
    assert (with_tail >= 0).all() and (with_tail <= (p.exp() * (p - q)).sum(-1) + 1e-12).all()
    torch.testing.assert_close(forward_kl_topk(top_q, top_p)[0], (coarse - tail_p * (tail_p.log() - tail_q.log())).clamp_min(0))
    torch.testing.assert_close(stats["teacher_tail_mass"], tail_p)


def test_a_zero_teacher_tail_adds_nothing_and_a_zero_student_tail_is_guarded():
    teacher = torch.tensor([[[0.5, 0.5]]]).log()
    student = torch.tensor([[[0.25, 0.75]]]).log()
    exact = (teacher.exp() * (teacher - student)).sum(-1)
    torch.testing.assert_close(forward_kl_topk_tail(student, teacher)[0], exact)
    teacher_with_tail = torch.tensor([[[0.4, 0.4]]]).log()
    guarded = forward_kl_topk_tail(student, teacher_with_tail, tail_mass_eps=1e-7)[0]
    assert torch.isfinite(guarded).all() and guarded > exact


def test_log_prob_min_clamp_floors_the_log_probs_in_the_sum_not_the_masses():
    teacher = torch.tensor([[[0.9, 1e-8]]]).log()
    student = torch.tensor([[[0.5, 1e-12]]]).log()
    loss, stats = forward_kl_topk(student, teacher, log_prob_min_clamp=-10.0)
    floored_s, floored_t = student.clamp_min(-10.0), teacher.clamp_min(-10.0)
    torch.testing.assert_close(loss, (floored_t.exp() * (floored_t - floored_s)).sum(-1))
    torch.testing.assert_close(stats["student_mass"], student.exp().sum(-1))


def test_student_equal_to_teacher_gives_zero_loss_in_every_mode(logits):
    student_logits, _ = logits
    q = student_logits.log_softmax(-1)
    top, ids = q.topk(4, -1)
    sampled = q[..., 0]
    for mode in DISTILL_LOSSES.names():
        cfg = loss_cfg(loss_mode=mode)
        outputs = {"log_probs": sampled, "gathered_log_probs": top, "topk_ids": ids}
        losses, _ = token_losses(cfg, outputs, {"teacher_log_probs": sampled, "teacher_topk_log_probs": top, "teacher_topk_ids": ids})
        torch.testing.assert_close(losses, torch.zeros_like(losses), atol=1e-12, rtol=0)


def test_overlap_ratio_counts_the_teachers_ids_the_student_also_ranks_top():
    teacher = torch.tensor([[[1, 2, 3, 4]]])
    student = torch.tensor([[[4, 9, 1, 7]]])
    torch.testing.assert_close(overlap_ratio(student, teacher), torch.tensor([[0.5]]))


def test_policy_gradient_form_has_the_negative_loss_as_advantage():
    """On-policy (ratio 1, inside the clip): d L / d log q = loss per token (A = -loss), with the loss detached."""
    g = torch.Generator().manual_seed(2)
    log_prob = torch.randn(B, R, generator=g, dtype=torch.float64).requires_grad_()
    teacher = torch.randn(B, R, generator=g, dtype=torch.float64)
    mask = torch.ones(B, R, dtype=torch.float64)
    cfg = loss_cfg(loss_mode="k1", use_policy_gradient=True, loss_max_clamp=0.5)
    losses, _ = token_losses(cfg, {"log_probs": log_prob}, {"teacher_log_probs": teacher})
    term, stats = distillation_loss(cfg, losses, mask, log_prob, log_prob.detach(), lambda m: m.sum())
    term.backward()
    torch.testing.assert_close(log_prob.grad, (log_prob - teacher).detach().clamp(-0.5, 0.5))
    assert set(stats) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
    # Off-policy by a ratio of e^0.5: tokens with a positive advantage (loss < 0) are past clip_ratio_high's 1.2 and
    # get no gradient; with clip_ratio_high=1.0 they are inside it again.
    for high, clipped in ((0.2, True), (1.0, False)):
        log_prob.grad = None
        cfg = loss_cfg(loss_mode="k1", use_policy_gradient=True, loss_max_clamp=None, clip_ratio_high=high)
        losses, _ = token_losses(cfg, {"log_probs": log_prob}, {"teacher_log_probs": teacher})
        distillation_loss(cfg, losses, mask, log_prob, log_prob.detach() - 0.5, lambda m: m.sum())[0].backward()
        positive = (log_prob < teacher).detach()
        assert (log_prob.grad[positive] == 0).all() == clipped and (log_prob.grad[~positive] != 0).all()


def test_direct_form_backpropagates_the_clamped_loss_and_verls_combination():
    losses = torch.tensor([[0.5, 20.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    term, _ = distillation_loss(loss_cfg(loss_max_clamp=10.0), losses, mask, None, None, lambda m: m.sum())
    assert term.item() == 10.5
    policy, distill = torch.tensor(2.0), torch.tensor(3.0)
    assert combined_loss(loss_cfg(distillation_loss_coef=0.5), policy, distill).item() == 3.5
    assert combined_loss(loss_cfg(use_task_rewards=False, distillation_loss_coef=0.5), policy, distill).item() == 3.0
