"""LoRA under Megatron (`actor_rollout_ref.model.lora.*`, verl's ppo_megatron_trainer tree; rlcore/engine/megatron/
lora.py). FSDP2's LoRA keeps verl's flat keys (`model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`);
the rules below refuse each set with the other backend, naming the keys to use. `merge` is the one
key of this section both backends read."""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from rlcore.config.names import LORA_A_INITS


@dataclass
class MegatronLoraConfig:
    type: str = "lora"  # lora (verl also names vlm_lora, canonical_lora, dora: refused)
    # the rollout gets merged weights every sync (True) or the base once, then the adapters alone (False); rlcore
    # reads it with FSDP's flat LoRA keys too (split pools always send merged weights)
    merge: bool = False
    rank: int = 0  # LoRA rank; 0 = full fine-tuning
    alpha: float = 32  # scaling numerator (scaling = alpha / rank)
    dropout: float = 0.0  # dropout on the adapter's input; rlcore: 0 only
    # megatron-core's dense linears to adapt (names or fnmatch patterns over full module names)
    target_modules: List[str] = field(default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
    exclude_modules: List[str] = field(default_factory=list)  # adapt every dense linear but these (target_modules empty)
    dropout_position: str = "pre"  # where dropout goes (pre | post); moot at dropout 0
    lora_A_init_method: str = "xavier"  # xavier (normal) | kaiming (uniform, a = sqrt(5))
    lora_B_init_method: str = "zero"  # zero: the adapted model starts as the base
    a2a_experimental: bool = False  # Megatron-Bridge's all-to-all LoRA communication
    dtype: Optional[Any] = None  # the adapters' dtype; rlcore: the model's params dtype (Megatron's fp32 main copy trains them)
    adapter_path: Optional[str] = None  # verl 0.9: start from this saved adapter (refused: use the FSDP2 lora_adapter_path)
    freeze_vision_model: bool = True  # verl 0.9, a vision-language model's: freeze its vision tower under LoRA
    freeze_vision_projection: bool = True  # verl 0.9: freeze the projection from the tower into the language model
    freeze_language_model: bool = True  # verl 0.9: freeze the language model's base weights under LoRA


# ---------------------------------------------------------------------------------------------------- rules
# Rules for LoRA: FSDP2's flat keys (`model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`) and
# Megatron's section (`model.lora.*`, the policy's only). Each set is refused with the other backend, naming the keys
# it takes. `c` is validate's checker (get / error).


def adapter_rank(get, model: str, strategy: str) -> int:
    """The LoRA rank a model trains with: `{model}.lora.rank` under Megatron, `{model}.lora_rank` otherwise (0: none).
    The one reading of the two keys for the engine's caller, the memory plan and the rehearsal."""
    if get(strategy) == "megatron" and get(f"{model}.lora.rank") is not None:
        return int(get(f"{model}.lora.rank"))
    return int(get(f"{model}.lora_rank") or 0)


# vLLM accepts these max_lora_rank values only (vllm.config.lora.MaxLoRARanks, 0.32)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int | None:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank` (None: above vLLM's largest)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def unmerged_lora_rank(get) -> int:
    """The policy's LoRA rank when its adapters reach the rollout unmerged (`actor_rollout_ref.model.lora.merge=False`,
    verl's default, read with either backend's LoRA keys), else 0: no LoRA, merge=True, or split pools (their
    cross-pool broadcast sends merged weights). The one reading for the worker, the rollout's build and the plan."""
    rank = adapter_rank(get, "actor_rollout_ref.model", "actor_rollout_ref.actor.strategy")
    return rank if rank and not get("actor_rollout_ref.model.lora.merge") and get("actor_rollout_ref.hybrid_engine") else 0


def check_lora(c, model: str, strategy: str) -> None:
    """`model`: the section holding lora_rank (actor_rollout_ref.model or critic.model); `strategy`: its role's backend."""
    m = c.get(model)
    rank = m.lora_rank
    megatron = c.get(strategy) == "megatron"
    if getattr(m, "lora", None) is not None and m.lora.rank is not None:  # the policy's model section only
        _check_megatron_lora(c, model, strategy, megatron)
    if rank < 0:
        c.error(f"{model}.lora_rank={rank} must be >= 0 (0 = full fine-tuning)")
    if rank <= 0:
        return
    if model == "actor_rollout_ref.model" and c.cfg.actor_rollout_ref.rollout.name == "vllm" and unmerged_lora_rank(c.get) \
            and vllm_max_lora_rank(rank) is None:
        c.error(f"{model}.lora_rank={rank}: vLLM applies adapters of rank <= {VLLM_LORA_RANKS[-1]} only; set {model}.lora.merge=True "
                "(the rollout then gets merged weights) or a smaller rank")
    if megatron:
        # verl's Megatron LoRA has its own section; lora_rank is its FSDP key
        c.error(f"{model}.lora_rank={rank} is the FSDP LoRA key; with {strategy}=megatron set {model}.lora.rank={rank} and "
                f"{model}.lora.alpha (verl's Megatron keys), and {model}.lora_rank=0")
    if m.lora_alpha <= 0:
        c.error(f"{model}.lora_alpha={m.lora_alpha} must be > 0 (scaling = lora_alpha / lora_rank; verl's examples use "
                f"lora_alpha={2 * rank} for lora_rank={rank})")
    targets = m.target_modules
    if isinstance(targets, str) and targets != "all-linear" or not isinstance(targets, str) and not (targets and all(isinstance(t, str) for t in targets)):
        c.error(f"{model}.target_modules={targets!r}: use all-linear or a list of module names, e.g. [q_proj,k_proj,v_proj,o_proj]")


def _check_megatron_lora(c, model: str, strategy: str, megatron: bool) -> None:
    lora = f"{model}.lora"
    section = c.get(lora)
    rank = section.rank
    if rank < 0:
        c.error(f"{lora}.rank={rank} must be >= 0 (0 = full fine-tuning)")
    if rank <= 0:
        return
    if not megatron:
        c.error(f"{lora}.rank={rank} is verl's Megatron LoRA section; with {strategy}={c.get(strategy)} use {model}.lora_rank={rank} "
                f"and {model}.lora_alpha (the FSDP keys), or {strategy}=megatron")
    if section.alpha <= 0:
        c.error(f"{lora}.alpha={section.alpha} must be > 0 (scaling = alpha / rank)")
    if section.type != "lora":
        c.error(f"{lora}.type={section.type}: rlcore's Megatron adapters are plain LoRA; use {lora}.type=lora")
    if section.dropout != 0:
        c.error(f"{lora}.dropout={section.dropout}: rlcore's Megatron LoRA has no dropout (its RNG would have to agree "
                f"over tensor-parallel ranks); use {lora}.dropout=0")
    c.choice(f"{lora}.lora_A_init_method", LORA_A_INITS)
    if section.lora_B_init_method != "zero":
        c.error(f"{lora}.lora_B_init_method={section.lora_B_init_method}: B starts at zero (the adapted model starts as "
                f"the base); use {lora}.lora_B_init_method=zero")
    if section.adapter_path:
        c.error(f"{lora}.adapter_path={section.adapter_path}: rlcore's Megatron adapters start at zero (B) and are saved "
                f"in its checkpoints; resume from a checkpoint (trainer.resume_mode), or train with FSDP2 from a peft "
                f"adapter ({model}.lora_adapter_path)")
    if section.exclude_modules and section.target_modules:
        c.error(f"{lora}.exclude_modules adapts every dense linear except those, so {lora}.target_modules must be empty (as in "
                f"verl): set {lora}.target_modules=[]")
