"""The distillation teacher role (`distillation.enabled`): one or more frozen models scoring the student's finished
samples token by token, written once over TrainEngine (native: an FSDP2 forward through the same log-prob head the
actor uses) or over vLLM engines (rlcore.rollout.vllm_teacher).

Every rank of the group holds every teacher: a native teacher sharded over the group (FSDP2), a vLLM one as one
engine per TP group of `inference.tensor_model_parallel_size` ranks (whole on each rank at TP 1). Either way each
rank scores its own share of the rows (a TP group gathers its ranks' rows into one engine call and hands each rank
its own back), so every teacher has the group's one data-parallel layout. The controller sends each teacher the rows
routed to it (`compute_teacher_log_prob(rows, teacher=name)`),
split over the ranks like any batch.
"""

from __future__ import annotations

import copy
import time

from rlcore.config.distill_schema import TeacherModelConfig, teacher_entries, uses_topk
from rlcore.config.schema import PPOConfig
from rlcore.config.typed import dotted
from rlcore.controller.decorator import DataLayout, Dispatch, register
from rlcore.engine.base import TokenRequest
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.models.hf import named_load
from rlcore.plan.micro_plan import TEACHER
from rlcore.protocol import DataProto
from rlcore.rollout.factory import build_teacher_scorer
from rlcore.workers import phases
from rlcore.workers.common import RoleWorker, layout_of, run_forward

# The columns a teacher adds: the sampled tokens' log-probs, and for the top-k losses its top-k tokens.
TEACHER_COLUMNS = ("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_ids")


def teacher_spec(cfg: PPOConfig, teacher: TeacherModelConfig, total_steps: int):
    """The EngineSpec of a native teacher: the reference's FSDP2 settings (a frozen model, as the reference is) over the
    teacher's own model directory, in the teacher's dtype; packed like the student when the student packs."""
    model = copy.deepcopy(cfg.actor_rollout_ref.model)
    model.path, model.tokenizer_path, model.hf_config_path = teacher.model_path, None, None
    model.override_config, model.trust_remote_code = {}, teacher.trust_remote_code
    role = copy.deepcopy(cfg.actor_rollout_ref.ref)
    role.fsdp_config.param_offload = teacher.inference.param_offload
    role.fsdp_config.dtype = teacher.inference.dtype
    role.fsdp_config.model_dtype = teacher.inference.dtype
    role.fsdp_config.mixed_precision.param_dtype = None
    role.ulysses_sequence_parallel_size, role.fsdp_config.ulysses_sequence_parallel_size = 1, 1
    role.use_torch_compile = False
    return engine_spec("fsdp2", model, role, None, 0.0, total_steps)


class TeacherWorker(RoleWorker):
    """One process per device holding every teacher (a shard of each native one; a vLLM engine per TP group)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        self.teachers = teacher_entries(self.config)
        loss = self.config.distillation.distillation_loss
        self.topk = loss.topk if uses_topk(dotted(self.config)) else 0
        self.engines, self.served = {}, {}  # native teachers' training engines; those a rollout engine serves
        for name, teacher in self.teachers.items():
            key = f"distillation.teacher_models.{name}.model_path"
            with named_load(key, teacher.model_path, f"teacher {name}"):
                served = build_teacher_scorer(teacher, name, self.device, self.topk, self.config.trainer.seed)
                if served is not None:
                    self.served[name] = served
                else:
                    self.engines[name] = build_engine("fsdp2", teacher_spec(self.config, teacher, total_steps), self.device,
                                                      key=f"distillation.teacher_models.{name}.inference.name")
                    phases.leave(self.engines[name])
        # A topk beyond a teacher's vocabulary is its whole vocabulary (the student's forward does the same).
        vocab = [engine.hf_config.vocab_size for engine in self.engines.values()] + [t.vocab_size for t in self.served.values()]
        self.topk = min([self.topk, *vocab])
        # Native teachers are sharded over the whole group (one data-parallel layout); vLLM ones are whole per rank.
        first = next(iter(self.engines.values()), None)
        self.layouts["teacher"] = layout_of(first) if first is not None else DataLayout(self.rank, self.world_size)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, mesh="teacher")
    def compute_teacher_log_prob(self, data: DataProto, teacher: str) -> DataProto:
        """Teacher `teacher`'s scores of these samples (input_ids spanning prompt + response, attention_mask,
        position_ids, responses): `teacher_log_probs` `[batch, response_len]` of the sampled tokens, and with the
        top-k losses `teacher_topk_log_probs` / `teacher_topk_ids` `[batch, response_len, topk]`, of softmax(logits /
        the teacher's temperature)."""
        start = time.perf_counter()
        t = self.teachers[teacher]
        if teacher in self.served:
            mask = data.batch["attention_mask"]
            scored = self.served[teacher].score(data.batch["input_ids"], mask, data.batch["responses"].shape[1], self.topk,
                                              t.inference.temperature)
        else:
            engine = self.engines[teacher]
            micro = self.micro_batches(TEACHER.format(name=teacher), engine)
            request = TokenRequest(t.inference.temperature, topk=self.topk)
            with phases.running(engine, "ref"):
                scored = run_forward(engine, data, micro, lambda outputs, mb: {k: outputs[k] for k in outputs if k in
                                                                               ("log_probs", "topk_log_probs", "topk_ids")}, request)
            if not len(scored):
                return scored
            scored = {k: scored.batch[k] for k in scored.batch.keys()}
        out = {"teacher_log_probs": scored["log_probs"]}
        if self.topk:
            out.update(teacher_topk_log_probs=scored["topk_log_probs"], teacher_topk_ids=scored["topk_ids"])
        meta = {"timing": {f"timing_s/teacher_on_rank/{teacher}": time.perf_counter() - start}}
        return DataProto.from_dict(out, meta_info=meta)
