"""The controller's side of distillation: a teacher whose tokenizer reads the student's ids differently is refused
before Ray starts, with the key and the reason."""

import time

import pytest

from rlcore.config import ConfigError, compose
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.trainer.distillation import tokenizer_mismatch
from rlcore.trainer.setup import check_teacher_tokenizers


def teacher_dir(tmp_path, name: str, change=None) -> str:
    tokenizer = build_char_tokenizer()
    if change:
        change(tokenizer)
    tokenizer.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def test_a_teacher_must_read_the_students_token_ids_as_the_student_does(tmp_path):
    student = build_char_tokenizer()
    assert tokenizer_mismatch(student, build_char_tokenizer()) is None
    same = teacher_dir(tmp_path, "same")
    longer = teacher_dir(tmp_path, "longer", lambda t: t.add_tokens(["<extra>"]))
    other_eos = teacher_dir(tmp_path, "eos", lambda t: setattr(t, "eos_token", "<|user|>"))
    cfg = compose(["recipe=tiny_cpu", "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={same}",
                   f"+distillation.teacher_models.math.model_path={longer}", "+distillation.teacher_models.math.key=m",
                   f"+distillation.teacher_models.code.model_path={other_eos}", "+distillation.teacher_models.code.key=c",
                   "distillation.teacher_models.teacher_model.key=t"])
    with pytest.raises(ConfigError) as err:
        check_teacher_tokenizers(cfg, student)
    assert len(err.value.messages) == 2
    assert err.value.messages[0].startswith(f"distillation.teacher_models.math.model_path={longer}: its tokenizer has 103 tokens, "
                                            "the student's 102; a teacher scores the student's own token ids")
    assert "its eos_token_id is" in err.value.messages[1]


class SlowTeacher:
    """A teacher group whose pass takes `seconds`: its log-probs are minus the sampled token ids."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.threads = seconds, set()

    def compute_teacher_log_prob(self, data, teacher):
        import threading

        from rlcore.protocol import DataProto

        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        return DataProto.from_dict({"teacher_log_probs": -data.batch["responses"].float()})


def test_a_teacher_pool_of_its_own_scores_while_the_actor_works_and_a_colocated_one_in_turn(tmp_path):
    import torch

    from rlcore.protocol import DataProto
    from rlcore.trainer.distillation import TeacherScoring

    base = ["recipe=tiny_cpu", "distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={tmp_path}"]
    responses = torch.arange(12).view(4, 3)
    batch = DataProto.from_dict({"input_ids": responses, "attention_mask": torch.ones_like(responses),
                                 "position_ids": responses, "responses": responses})
    for overrides, overlaps in (([], False), (["distillation.n_gpus_per_node=1", "distillation.nnodes=1"], True)):
        group = SlowTeacher(0.4)
        scoring = TeacherScoring(compose(base + overrides), group)
        start = time.perf_counter()
        pending = scoring.start(batch)
        time.sleep(0.4)  # the actor's passes
        metrics = {}
        scoring.finish(batch, metrics, pending)
        scoring.close()
        assert (time.perf_counter() - start < 0.7) == overlaps
        assert any(name.startswith("teacher") for name in group.threads) == overlaps
        assert torch.equal(batch.batch["teacher_log_probs"], -responses.float()) and metrics["distillation/teacher_model/sample_share"] == 1
