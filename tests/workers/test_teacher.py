"""The distillation teacher role and the student's distillation loss, in one process over tiny models:
- a teacher's scores are HF's own forward of each sample (sampled-token log-probs and top-k, fp32);
- a teacher equal to the student gives a loss of about zero (the top-k forward KL with its tail);
- rows are routed to their teacher by data_source, and the student's updates pull it towards a different teacher
  (the distillation loss falls update after update)."""

import numpy as np
import pytest
import torch
from conftest import build_tiny_model_dir
from dist_utils import close_gloo, free_port, init_gloo
from grpo_step import family_cfg, grpo_batch, prompts_batch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from rlcore.protocol import DataProto
from rlcore.trainer.distillation import TeacherScoring
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker
from rlcore.workers.teacher import TeacherWorker

pytestmark = pytest.mark.numerics
D = "distillation"
K = 4


def distill_cfg(student: str, other: str, task_dir: str, out_dir, *overrides: str) -> dict:
    """Teacher `same` (the student's own weights) for data_source a, teacher `other` (another, wider model) for b."""
    return family_cfg(student, task_dir, out_dir, f"{D}.enabled=True", f"+{D}.teacher_models.same.model_path={student}",
                      f"+{D}.teacher_models.same.key=a", f"+{D}.teacher_models.other.model_path={other}",
                      f"+{D}.teacher_models.other.key=b", f"{D}.distillation_loss.topk={K}", "actor_rollout_ref.rollout.temperature=1.0",
                      "actor_rollout_ref.actor.use_kl_loss=False", *overrides)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    return build_tiny_model_dir(str(root / "student")), build_tiny_model_dir(str(root / "teacher"), seed=5, hidden=96)


@pytest.fixture
def workers(models, tiny_task_dir, tmp_path):
    """A student worker and a teacher worker (both teachers) for the top-k forward KL with its tail, direct (GKD).
    Per test: a test's process group ends with it (tests/conftest.py), and the engines are built on it."""
    init_gloo(0, 1, free_port())
    cfg = distill_cfg(*models, tiny_task_dir, tmp_path, f"{D}.distillation_loss.loss_mode=forward_kl_topk_tail",
                      f"{D}.distillation_loss.use_policy_gradient=False", f"{D}.distillation_loss.use_task_rewards=False")
    student, teacher = ActorRolloutRefWorker(cfg, 0, 1, "cpu"), TeacherWorker(cfg, 0, 1, "cpu")
    student.init_model(total_steps=4)
    teacher.init_model(total_steps=4)
    sampled = student.generate_sequences(prompts_batch(student.actor.hf_config.vocab_size))
    yield cfg, student, teacher, sampled
    close_gloo()


def hf_log_softmax(model_dir: str, batch: DataProto) -> torch.Tensor:
    """`[batch, response_len, vocab]`: HF's log_softmax predicting each response token, each sample alone."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    response_len = batch.batch["responses"].shape[1]
    out = torch.zeros(len(batch), response_len, model.config.vocab_size)
    for i, (ids, mask) in enumerate(zip(batch.batch["input_ids"], batch.batch["attention_mask"])):
        prompt_len = int(mask[: ids.shape[0] - response_len].sum())
        tokens = ids[mask.bool()]
        with torch.no_grad():
            logits = model(input_ids=tokens[None]).logits[0].float()
        out[i, : len(tokens) - prompt_len] = logits[prompt_len - 1 : len(tokens) - 1].log_softmax(-1)
    return out


def test_a_teachers_scores_are_hfs_forward_of_each_sample(models, workers):
    _, _, teacher, sampled = workers
    scored = teacher.compute_teacher_log_prob(sampled, teacher="other").batch
    expected = hf_log_softmax(models[1], sampled)
    mask = sampled.batch["response_mask"].bool()
    sampled_lp = expected.gather(-1, sampled.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(scored["teacher_log_probs"][mask], sampled_lp[mask], atol=1e-5, rtol=1e-5)
    top, ids = expected.topk(K, -1)
    torch.testing.assert_close(scored["teacher_topk_log_probs"][mask], top[mask], atol=1e-5, rtol=1e-5)
    assert torch.equal(scored["teacher_topk_ids"][mask], ids[mask])


def test_rows_go_to_their_teacher_and_the_students_own_weights_score_like_its_rollout(workers):
    """A two-source batch: data_source a goes to `same`, b to `other` (verl's default teacher_key); then the same
    rows routed by another column (distillation.teacher_key=domain)."""
    cfg, _, teacher, sampled = workers
    cfg = OmegaConf.create(cfg)
    alternating = np.array(["a", "b"] * (len(sampled) // 2), dtype=object)
    for key, columns in (("data_source", {"data_source": alternating}),
                         ("domain", {"domain": alternating, "data_source": np.array(["b"] * len(sampled), dtype=object)})):
        cfg.distillation.teacher_key = key
        batch, metrics = DataProto(sampled.batch.clone(), dict(columns)), {}
        TeacherScoring(cfg, teacher)(batch, metrics)
        rows_a, mask = np.arange(0, len(batch), 2), batch.batch["response_mask"].bool()
        same = batch.batch["teacher_log_probs"][rows_a][mask[rows_a]]
        torch.testing.assert_close(same, batch.batch["rollout_log_probs"][rows_a][mask[rows_a]], atol=1e-5, rtol=1e-5)
        assert metrics["distillation/same/sample_share"] == metrics["distillation/other/sample_share"] == 0.5
        assert metrics["distillation/same/rollout_reverse_kl"] < 1e-5 < 1e-2 < metrics["distillation/other/rollout_reverse_kl"]


def scored_batch(student, teacher, sampled, name: str) -> DataProto:
    batch = grpo_batch(DataProto(sampled.batch.clone(), dict(sampled.non_tensor_batch)), student)  # union() adds in place
    batch.union(teacher.compute_teacher_log_prob(batch, teacher=name))
    batch.meta_info["on_policy"] = False
    return batch


def test_a_teacher_equal_to_the_student_gives_a_loss_of_about_zero(workers):
    _, student, teacher, sampled = workers
    batch = scored_batch(student, teacher, sampled, "same")
    keys = [k for k in batch.batch.keys() if k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                                                   "advantages", "old_log_probs") or k.startswith("teacher_")]
    metrics = student.update_actor(batch.select(keys))
    assert abs(metrics["actor/distillation/loss"]) < 1e-5 and metrics["actor/distillation/loss_max"] < 1e-4
    assert metrics["actor/distillation/overlap_ratio"] == pytest.approx(1.0)
    assert metrics["actor/distillation/teacher_mass"] == pytest.approx(metrics["actor/distillation/student_mass"], abs=1e-5)


def test_updates_pull_the_student_towards_another_teacher(workers):
    _, student, teacher, sampled = workers
    batch = scored_batch(student, teacher, sampled, "other")
    keys = [k for k in batch.batch.keys() if k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                                                   "advantages", "old_log_probs") or k.startswith("teacher_")]
    losses = [student.update_actor(batch.select(keys))["actor/distillation/loss"] for _ in range(4)]
    # Two random tiny models are both near uniform: a small KL to begin with (measured 0.0052), cut ~14x in 4 updates
    assert losses[0] > 1e-3 and all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.3 * losses[0], losses


def first_update_loss(models, tiny_task_dir, out_dir, *overrides, config_name="ppo_trainer") -> tuple[float, float]:
    """(the distillation loss of a first update from teacher `other`, of the last of three): a fresh student in
    its own process group, with the config's overrides."""
    init_gloo(0, 1, free_port())
    try:
        cfg = family_cfg(models[0], tiny_task_dir, out_dir, f"{D}.enabled=True", f"{D}.teacher_models.teacher_model.model_path={models[1]}",
                         f"{D}.distillation_loss.topk={K}", "actor_rollout_ref.actor.use_kl_loss=False", *overrides, config_name=config_name)
        student, teacher = ActorRolloutRefWorker(cfg, 0, 1, "cpu"), TeacherWorker(cfg, 0, 1, "cpu")
        student.init_model(total_steps=4)
        teacher.init_model(total_steps=4)
        sampled = student.generate_sequences(prompts_batch(student.actor.hf_config.vocab_size))
        batch = scored_batch(student, teacher, sampled, "teacher_model")
        keys = [k for k in batch.batch.keys() if k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                                                       "advantages", "old_log_probs") or k.startswith("teacher_")]
        losses = [student.update_actor(batch.select(keys))["actor/distillation/loss"] for _ in range(3)]
        return losses[0], losses[-1]
    finally:
        close_gloo()


TOPK_DIRECT = (f"{D}.distillation_loss.loss_mode=forward_kl_topk", f"{D}.distillation_loss.use_policy_gradient=False",
               f"{D}.distillation_loss.use_task_rewards=False")


def test_packed_token_budget_micro_batches_give_the_padded_loss(models, tiny_task_dir, tmp_path):
    """The teacher's `[batch, response, k]` columns travel with trimmed, reordered, packed micro-batches."""
    padded = first_update_loss(models, tiny_task_dir, tmp_path / "padded", *TOPK_DIRECT)
    packed = first_update_loss(models, tiny_task_dir, tmp_path / "packed", *TOPK_DIRECT, "actor_rollout_ref.model.use_remove_padding=True",
                               "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30")
    assert packed[0] == pytest.approx(padded[0], rel=1e-4)


def test_a_lora_student_distils(models, tiny_task_dir, tmp_path):
    first, last = first_update_loss(models, tiny_task_dir, tmp_path, *TOPK_DIRECT, "actor_rollout_ref.model.lora_rank=8",
                                    "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=5e-2")
    assert 0 < last < 0.8 * first


def test_a_megatron_student_distils_with_an_estimator(models, tiny_task_dir, tmp_path):
    """Megatron's head gives the sampled tokens' log-probs: k3 backpropagated directly (GKD with a single-sample
    estimator) moves the student towards the teacher."""
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state as mpu

    try:
        first, last = first_update_loss(models, tiny_task_dir, tmp_path, f"{D}.distillation_loss.loss_mode=k3",
                                        f"{D}.distillation_loss.use_policy_gradient=False", f"{D}.distillation_loss.use_task_rewards=False",
                                        config_name="ppo_megatron_trainer")
    finally:
        mpu.destroy_model_parallel()
    assert 0 < last < 0.8 * first
