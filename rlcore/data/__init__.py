"""Data: verl-format parquet prompts, the synthetic tiny_add task, the offline char tokenizer, the batch loader.

Names are imported lazily (PEP 562) so that `python -m rlcore.data.synthetic` does not import torch and
transformers first, and runpy does not warn about the module being imported twice.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RLHFDataset": "rlcore.data.dataset",
    "collate_fn": "rlcore.data.dataset",
    "truncate_ids": "rlcore.data.dataset",
    "PromptLoader": "rlcore.data.loader",
    "TASK_NAME": "rlcore.data.synthetic",
    "make_addition_rows": "rlcore.data.synthetic",
    "write_parquet": "rlcore.data.synthetic",
    "write_task": "rlcore.data.synthetic",
    "build_char_tokenizer": "rlcore.data.tokenizer",
    "CHAT_TEMPLATE": "rlcore.data.tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlcore.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
