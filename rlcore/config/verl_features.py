"""verl's keys that rlcore's schema lacks, by the feature they belong to, each with why and what to use instead.

A verl user who pastes `actor_rollout_ref.model.mtp.enable=True` is not misspelling a key: "did you mean" would
send them after a key that does something else. So a key that verl has and rlcore does not is refused naming verl's
feature, rlcore's reason and the alternative (rlcore/config/keys.py asks this table first). Patterns are fnmatch
patterns over full keys; the first that matches answers. docs/reference/config.md lists every such key of verl's.
"""

from __future__ import annotations

import fnmatch
from typing import Optional

# (patterns, verl's feature, why rlcore lacks it and what to use instead)
VERL_FEATURES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("*.model.mtp.*", "*.rollout.mtp", "*.rollout.mtp.*"),
     "multi-token prediction (MTP) training and speculative rollout", "not in rlcore yet: its model families have no "
     "MTP heads"),
    (("*.qat.*", "*.qat"), "quantization-aware training (QAT)", "not in rlcore: its engines train in the model's dtype "
     "(fsdp_config.dtype / megatron.dtype)"),
    (("*.turbo_config.*", "*.turbo_config"), "FSDP turbo engine (strategy=fsdp_turbo)", "not in rlcore: its FSDP2 engine "
     "takes fsdp_config.* and ulysses_sequence_parallel_size"),
    (("*.disaggregation.*", "*.disaggregation"), "prefill/decode disaggregated rollout", "not in rlcore: each rollout "
     "replica prefills and decodes its own requests"),
    (("*.precision_debugger.*", "*.precision_debugger"), "the precision debugger profiler",
     "not in rlcore; global_profiler.tool=torch or torch_memory profile the run"),
    (("critic.model.lora.*",), "the critic's Megatron LoRA section", "not in rlcore: the critic trains LoRA adapters "
     "with critic.model.lora_rank / lora_alpha / target_modules (FSDP2)"),
    (("actor_rollout_ref.rollout.trace.*",), "rollout tracing (weave / mlflow traces)",
     "not in rlcore; trainer.rollout_data_dir writes every step's generations as JSONL"),
    (("actor_rollout_ref.rollout.prometheus.*",), "Prometheus metrics of the rollout servers",
     "rlcore's rollout runs in-process, with no server to scrape; its rollout/* metrics go to every tracker"),
    (("*.tiled_mlp.*",), "tiled MLP (sequence-tiled MLP activations)",
     "not in rlcore; for long sequences use ulysses_sequence_parallel_size and gradient checkpointing"),
    (("*.fused_kernel_options.*", "*.use_liger", "*.use_fused_kernels"), "fused / Liger kernels",
     "rlcore's log-prob head already works a chunk of tokens at a time without [tokens, vocab] logits "
     "(rlcore/models/logits.py); it takes use_fused_kernels, use_liger and fused_kernel_options.impl_backend on the "
     "policy's model section (with no effect)"),
    (("actor_rollout_ref.rollout.engine_kwargs.sglang*", "actor_rollout_ref.rollout.engine_kwargs.trtllm*"),
     "SGLang / TensorRT-LLM engine options", "rlcore's rollout engines are native and vllm (neither has a CPU build "
     "to test them on in CI)"),
    (("*.rollout.quantization*",), "quantized rollout (fp8 weights in the rollout engine)",
     "not in rlcore: the rollout receives the training weights in the rollout dtype"),
    (("actor_rollout_ref.rollout.skip_rollout", "actor_rollout_ref.rollout.skip_dump_dir", "skip.*", "skip"),
     "rollout replay from a dump (verl 0.9: skip.*)", "not in rlcore"),
    (("data.datagen.*", "data.custom_cls.*"), "custom dataset classes", "not in rlcore: data is parquet in verl's row "
     "format, checked at load"),
    (("reward_model.sandbox_fusion.*", "reward.sandbox_fusion.*", "sandbox_fusion.*", "reward.sandbox_fusion", "sandbox_fusion"),
     "Sandbox Fusion code execution for rewards", "not in rlcore: write a reward.custom_reward_function that calls your "
     "sandbox (it runs in its own process with a timeout)"),
    (("reward_manager.*",), "verl 0.8's reward-manager section of its reward loop",
     "rlcore selects its manager with reward.reward_manager.name (naive, dapo, gdpo), verl 0.9's key"),
    (("reward_model.reward_loop_source", "reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name"),
     "a reward-manager class of the user's (verl 0.9: reward.reward_manager.source=importlib)",
     "rlcore runs its own managers by name (reward.reward_manager.name: naive, dapo, gdpo); put your scoring in "
     "reward.custom_reward_function"),
    (("transfer_queue.*", "transfer_queue"), "transfer queue", "not in rlcore: batches move through Ray's object store"),
    (("*.veomni.*", "*.veomni"), "VeOmni engine's options (model_engine=veomni)", "rlcore has no VeOmni engine: use "
     "model_engine=dp (rlcore's FSDP2: fsdp_config.*, ulysses_sequence_parallel_size) or model_engine=megatron "
     "(expert parallelism)"),
)


# Keys that verl's example scripts set but verl's own tree lacks too (its Hydra refuses them as rlcore does): the script
# fails on verl as well, so the message says so and what the script meant
NOT_VERL_KEYS: dict[str, str] = {
    "actor_rollout_ref.actor.model_engine": "the engine is verl 0.9's top-level group: model_engine=megatron",
}


def not_a_verl_key(key: str) -> Optional[str]:
    """What a key that verl 0.9 refuses too meant, or None."""
    return next((hint for pattern, hint in NOT_VERL_KEYS.items() if fnmatch.fnmatchcase(key, pattern)), None)


def verl_feature(key: str) -> Optional[tuple[str, str]]:
    """(verl's feature, why rlcore lacks it) for a verl key rlcore's schema does not have; None for any other key."""
    for patterns, feature, why in VERL_FEATURES:
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            return feature, why
    return None
