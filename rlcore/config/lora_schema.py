"""LoRA under Megatron (`actor_rollout_ref.model.lora.*`, verl's ppo_megatron_trainer tree; rlcore/engine/megatron/
lora.py). FSDP2's LoRA keeps verl's flat keys (`model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`);
rlcore/config/validate_lora.py refuses each set with the other backend, naming the keys to use. `merge` is the one
key of this section both backends read."""

from dataclasses import dataclass, field
from typing import Any, List, Optional


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
