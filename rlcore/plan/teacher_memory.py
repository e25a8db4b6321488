"""The distillation teachers in the memory plan (rlcore.plan.memory): each native teacher is a frozen forward
sharded over the teacher pool (the actor's devices when colocated, as rlcore.plan.placement puts it), planned like
the reference with the teacher's own model and micro-batches; a vLLM teacher keeps its share of the device
(inference.gpu_memory_utilization) for its weights and cache the whole run (it never sleeps for the actor).

This module imports neither torch nor ray.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from rlcore.config.distill_schema import teacher_entries
from rlcore.plan.arch import resolve_arch
from rlcore.rollout.sizing import rollout_sizing


def teacher_phases(est, cfg, role_cls, pool: int, world: int, capacity: float) -> tuple[list, list, dict]:
    """(notes, phases [(name, role, pool)] of the native teachers' scoring passes, resident {name: (GiB, pool)} of
    the vLLM teachers). `role_cls`: the plan's role record (rlcore.plan.memory._Role)."""
    notes, phases, resident = [], [], {}
    try:
        teachers = teacher_entries(cfg)
    except KeyError:
        return notes, phases, resident  # validation names the key
    for name, teacher in teachers.items():
        arch, where = resolve_arch(teacher.model_path)
        key = f"distillation.teacher_models.{name}"
        if arch is None:
            notes.append(f"teacher {name}: not estimated: {where}; set {key}.model_path to a directory with config.json")
            continue
        i = teacher.inference
        engine = rollout_sizing(i.name)
        notes.append(f"teacher {name}: {arch.params(False) / 1e9:.2f}B params, {arch.layers} layers, hidden {arch.hidden} ({where}), "
                     f"{engine.teacher_runs_as} on {'the actor devices' if pool == 0 else 'its own pool'}")
        held = engine.teacher_resident(key, i, capacity)
        if held is not None:  # served by a rollout engine that keeps its share the whole run
            label, gib = held
            resident[f"teacher {name} ({label})"] = (gib, pool)
            continue
        fsdp = OmegaConf.merge(cfg.actor_rollout_ref.ref.fsdp_config, {"dtype": i.dtype, "model_dtype": i.dtype,
                                                                       "param_offload": i.param_offload})
        fsdp.mixed_precision.param_dtype = None
        max_len, resp = est.max_len, est.resp
        if i.log_prob_use_dynamic_bsz:
            tokens, budget_key = i.log_prob_max_token_len_per_gpu, f"{key}.inference.log_prob_max_token_len_per_gpu"
            response_tokens = min(tokens, -(-tokens * resp // max_len))
        else:
            rows = i.log_prob_micro_batch_size_per_gpu or 1
            tokens, response_tokens, budget_key = rows * max_len, rows * resp, f"{key}.inference.log_prob_micro_batch_size_per_gpu"
        phases.append((f"teacher {name} scores", role_cls(f"teacher {name} scores", arch, f"{key}.inference", fsdp, world, 0, False,
                                                          tokens, response_tokens, budget_key, False, "", False), pool))
    return notes, phases, resident
