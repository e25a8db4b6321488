"""verl's custom data sampler (`data.sampler.class_path` / `class_name`): a user class that yields the training
rows' indices in the order it wants them drawn. verl's interface, duck-typed (a verl sampler runs unchanged once
its `verl` import is gone): built as `Class(data_source=dataset, data_config=cfg.data)`, iterated once per epoch
(`set_epoch(epoch)` first if it has one), sized by `len()`; a curriculum sampler also has `update(batch)`, which
rlcore calls with each step's scored batch (rlcore.protocol.DataProto: `batch["token_level_scores"]`, the prompts'
`non_tensor_batch` columns, ...) before the next prompts are drawn. rlcore.data.loader.PromptLoader draws from it.
"""

from __future__ import annotations

from typing import Any

from rlcore.utils.import_file import import_module_or_file

KEY = "data.sampler"


def build_sampler(data_cfg: Any, dataset: Any) -> Any | None:
    """The configured sampler over `dataset`, or None (data.shuffle decides the order)."""
    path, name = data_cfg.sampler.class_path, data_cfg.sampler.class_name
    if path is None:
        return None
    module = import_module_or_file(path, f"{KEY}.class_path")
    cls = getattr(module, name or "", None)
    if not isinstance(cls, type):
        defined = sorted(k for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise ValueError(f"{KEY}.class_name={name!r} is not a class in {path}; classes defined there: {defined or 'none'}")
    sampler = cls(data_source=dataset, data_config=data_cfg)
    missing = [m for m in ("__iter__", "__len__") if not hasattr(sampler, m)]
    if missing:
        raise TypeError(f"{KEY}.class_name={name}: a sampler yields row indices (__iter__) and says how many (__len__); "
                        f"{name} lacks {', '.join(missing)}")
    return sampler
