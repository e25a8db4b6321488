"""Picks a rollout engine by `actor_rollout_ref.rollout.name` and maps the run's config onto its arguments; the only
module that imports the implementations (workers never branch on the engine)."""

from __future__ import annotations

from rlcore.config.lora_schema import unmerged_lora_rank
from rlcore.config.typed import dotted, plain
from rlcore.rollout.base import RolloutEngine


def build_rollout_from_config(config, pad_token_id: int, device, rank: int) -> RolloutEngine:
    """The engine `actor_rollout_ref.rollout.name` names, built from the run's config (rollout_kwargs)."""
    return build_rollout(config.actor_rollout_ref.rollout.name, **rollout_kwargs(config, pad_token_id, device, rank))


def build_rollout(name: str, **kwargs) -> RolloutEngine:
    if name in ("native", "hf"):
        from rlcore.rollout.native import NativeRollout

        return NativeRollout(**kwargs)
    if name == "vllm":
        from rlcore.rollout.vllm import VLLMRollout

        return VLLMRollout(**kwargs)
    raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not supported by rlcore; use native or vllm")


def build_teacher_scorer(teacher, name: str, device, topk: int, seed: int):
    """A distillation teacher served by a rollout engine (`inference.name=vllm`: rlcore.rollout.vllm_teacher), or None
    for one the teacher worker runs as a frozen training engine's forward (native). `teacher`: the entry as
    rlcore.config.distill_schema.teacher_entries resolves it; `topk`: the most top-k tokens any score asks for."""
    i = teacher.inference
    if i.name != "vllm":
        return None
    from rlcore.rollout.vllm_teacher import VLLMTeacher

    return VLLMTeacher(teacher.model_path, device=device, name=name, dtype=i.dtype, max_model_len=i.max_model_len, topk=topk,
                       seed=seed, gpu_memory_utilization=i.gpu_memory_utilization, max_num_seqs=i.max_num_seqs,
                       max_num_batched_tokens=i.max_num_batched_tokens, enforce_eager=i.enforce_eager,
                       tensor_parallel_size=i.tensor_model_parallel_size, expert_parallel_size=i.expert_parallel_size,
                       engine_kwargs=i.engine_kwargs.get("vllm") or {}, trust_remote_code=teacher.trust_remote_code)


def rollout_kwargs(config, pad_token_id: int, device, rank: int) -> dict:
    """The rollout engine's arguments from the run's config (`actor_rollout_ref.rollout.*`, the policy's model
    section): what both engines take, then each engine's own. Sampling seeds follow `rollout.seed` (which follows
    trainer.seed unless set) and differ per data-parallel replica (vLLM's TP peers share one)."""
    cfg = config.actor_rollout_ref
    rollout = cfg.rollout
    seed = rollout.seed
    kwargs = dict(
        model_path=cfg.model.path, pad_token_id=pad_token_id, device=device,
        dtype="float32" if device.type == "cpu" else rollout.dtype,
        override_config=dict(plain(cfg.model.override_config)), seed=seed * 1000 + rank,
        hf_config_path=cfg.model.hf_config_path, trust_remote_code=cfg.model.trust_remote_code,
    )
    kwargs.update(max_num_seqs=rollout.max_num_seqs, max_num_batched_tokens=rollout.max_num_batched_tokens,
                  gpu_memory_utilization=rollout.gpu_memory_utilization,
                  max_model_len=rollout.max_model_len or rollout.prompt_length + rollout.response_length)
    if rollout.name != "vllm":
        sizes = rollout.cudagraph_capture_sizes
        kwargs.update(enforce_eager=rollout.enforce_eager, cudagraph_capture_sizes=None if sizes is None else list(sizes),
                      record_routes=rollout.enable_rollout_routing_replay)
        kwargs.update(plain(rollout.engine_kwargs.native))
    else:
        kwargs.update(
            tensor_parallel_size=rollout.tensor_model_parallel_size,
            enable_chunked_prefill=rollout.enable_chunked_prefill, enable_prefix_caching=rollout.enable_prefix_caching,
            enforce_eager=rollout.enforce_eager, load_format=rollout.load_format, expert_parallel_size=rollout.expert_parallel_size,
            disable_log_stats=rollout.disable_log_stats, engine_kwargs=dict(plain(rollout.engine_kwargs.vllm)),
            record_routes=rollout.enable_rollout_routing_replay,
            lora_rank=unmerged_lora_rank(dotted(config)),  # vLLM's LoRA support, for the adapters
            full_determinism=rollout.full_determinism,  # vLLM's batch-invariant kernels (the process's switches: the worker)
        )
        kwargs["seed"] = seed * 1000  # the adapter adds the DP replica index: TP peers must share a seed
    return kwargs
