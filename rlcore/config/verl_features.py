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
    (("actor_rollout_ref.model.mtp.*",), "multi-token prediction (MTP) training",
     "not in rlcore: its model families have no MTP heads"),
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
    (("actor_rollout_ref.rollout.quantization*",), "quantized rollout (fp8 weights in the rollout engine)",
     "not in rlcore: the rollout receives the training weights in the rollout dtype"),
    (("actor_rollout_ref.rollout.skip_rollout", "actor_rollout_ref.rollout.skip_dump_dir"), "rollout replay from a dump",
     "not in rlcore"),
    (("data.datagen.*", "data.custom_cls.*"), "custom dataset classes", "not in rlcore: data is parquet in verl's row "
     "format, checked at load"),
    (("reward_model.sandbox_fusion.*",), "Sandbox Fusion code execution for rewards",
     "not in rlcore: write a custom_reward_function that calls your sandbox (it runs in its own process with a timeout)"),
    (("reward_manager.*",), "the reward-manager section of verl's reward loop",
     "rlcore selects its manager with reward_model.reward_manager (naive, dapo)"),
    (("transfer_queue.*", "transfer_queue"), "the transfer queue", "not in rlcore: batches move through Ray's object store"),
)


def verl_feature(key: str) -> Optional[tuple[str, str]]:
    """(verl's feature, why rlcore lacks it) for a verl key rlcore's schema does not have; None for any other key."""
    for patterns, feature, why in VERL_FEATURES:
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            return feature, why
    return None
