"""Rules for LoRA (`model.lora_rank`, `lora_alpha`, `target_modules`). `c` is validate's checker (get / error)."""

from __future__ import annotations


def check_lora(c, model: str, strategy: str) -> None:
    """`model`: the section holding lora_rank (actor_rollout_ref.model or critic.model); `strategy`: its role's backend."""
    rank = c.get(f"{model}.lora_rank")
    if rank < 0:
        c.error(f"{model}.lora_rank={rank} must be >= 0 (0 = full fine-tuning)")
    if rank <= 0:
        return
    if c.get(strategy) == "megatron":
        # megatron-core 0.16 has no adapter layers of its own (NeMo / Megatron-Bridge add them on top), and its
        # fused TP linears are not modules peft can wrap.
        c.error(f"{model}.lora_rank={rank} with {strategy}=megatron is not supported: megatron-core has no LoRA layers and peft "
                f"cannot wrap its tensor-parallel linears; use {strategy}=fsdp2 for LoRA, or {model}.lora_rank=0")
    if c.get(f"{model}.lora_alpha") <= 0:
        c.error(f"{model}.lora_alpha={c.get(f'{model}.lora_alpha')} must be > 0 (scaling = lora_alpha / lora_rank; verl's examples use "
                f"lora_alpha={2 * rank} for lora_rank={rank})")
    targets = c.get(f"{model}.target_modules")
    if isinstance(targets, str) and targets != "all-linear" or not isinstance(targets, str) and not (targets and all(isinstance(t, str) for t in targets)):
        c.error(f"{model}.target_modules={targets!r}: use all-linear or a list of module names, e.g. [q_proj,k_proj,v_proj,o_proj]")
