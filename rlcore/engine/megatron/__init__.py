"""Megatron TP/PP training engine on megatron-core (`pip install 'rlcore[megatron]'`)."""

import warnings

# megatron-core announces each fallback it takes without Apex / Transformer Engine (CUDA-only extras) and defaults
# it deprecates itself, once per module and worker: expected here, and noise in every worker's log.
for _message in ("Apex is not installed", "Transformer Engine and Apex are not installed", "full scope is deprecated",
                 "When using sequence parallelism it is recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS"):
    warnings.filterwarnings("ignore", message=_message)

try:
    import megatron.core  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised only where the extra is missing
    raise ImportError("strategy=megatron needs megatron-core: pip install 'rlcore[megatron]' "
                      f"(megatron-core==0.16.1; on CPU, constrain torch: pip install -c constraints.txt ...) (import failed: {err})") from err

from rlcore.engine.megatron.engine import MegatronEngine  # noqa: E402

__all__ = ["MegatronEngine"]
