"""Rules for `<role>.megatron.*` (strategy=megatron): what rlcore's megatron engine does not do, refused before Ray
starts and naming the key. `c` is validate's checker (get / error). The engine re-checks MEGATRON_UNSUPPORTED for
callers that build it directly."""

from __future__ import annotations

# <role>.megatron.<key>: (the value rlcore supports, what any other value would ask for)
MEGATRON_UNSUPPORTED = {
    "context_parallel_size": (1, "context parallelism"),
    "expert_model_parallel_size": (1, "expert parallelism (MoE)"),
    "use_dist_checkpointing": (False, "initial weights from a Megatron dist checkpoint; rlcore reads the HF checkpoint at model.path"),
}


def check_megatron(c, section: str) -> None:
    """What rlcore's megatron engine does not do, refused before Ray starts, naming the key."""
    for key, (ok, what) in MEGATRON_UNSUPPORTED.items():
        if c.get(f"{section}.{key}") != ok:
            c.error(f"{section}.{key}={c.get(f'{section}.{key}')} ({what}) is not supported by rlcore; use {section}.{key}={ok}")
    if c.get(f"{section}.override_mcore_model_config"):
        c.error(f"{section}.override_mcore_model_config is not supported by rlcore: its megatron engine derives the GPTModel "
                "from the HF config.json; change the model with actor_rollout_ref.model.override_config (HF keys) and "
                f"the layers with {section}.override_transformer_config")
    pp, vpp = c.get(f"{section}.pipeline_model_parallel_size"), c.get(f"{section}.virtual_pipeline_model_parallel_size")
    if vpp is not None and vpp > 1 and pp < 2:
        c.error(f"{section}.virtual_pipeline_model_parallel_size={vpp} interleaves pipeline stages and needs "
                f"pipeline_model_parallel_size >= 2 (it is {pp}); use {section}.virtual_pipeline_model_parallel_size=null")


def check_same_layout(c, ref: str, actor: str) -> None:
    """The reference shares the actor's processes, and megatron-core one layout per process."""
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"):
        if c.get(f"{ref}.{key}") != c.get(f"{actor}.{key}"):
            c.error(f"{ref}.{key}={c.get(f'{ref}.{key}')} differs from {actor}.{key}={c.get(f'{actor}.{key}')}: the reference "
                    f"runs in the actor's processes, which hold one megatron layout; use {ref}.{key}={c.get(f'{actor}.{key}')}")
