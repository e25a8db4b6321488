"""The names a config key may take where rlcore holds the implementations in a registry: one torch-free list each,
read by the validator (which must not import torch) and by the registry that implements them (which refuses to
register a name missing here, so the two cannot drift; tests/config/test_names.py checks every name is implemented).

Registries users extend at run time (advantage estimators and policy losses through custom_algorithms.path) are not
listed: their names are checked when the trainer looks them up.
"""

from __future__ import annotations

_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS = _KL_BASE + tuple(name + "+" for name in _KL_BASE)  # "+": straight-through k2 gradient (rlcore.algos.kl)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")  # rlcore.algos.agg
REWARD_MANAGERS = ("naive", "dapo", "gdpo")  # rlcore.reward.manager
TOOL_CALL_FORMATS = ("hermes", "qwen")  # rlcore.rollout.agent_loop.PARSERS (qwen: SGLang's name for hermes' format)
LORA_A_INITS = ("xavier", "kaiming")  # rlcore.engine.megatron.lora: model.lora.lora_A_init_method
