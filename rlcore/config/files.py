"""Data-file keys (`data.train_files`, `data.val_files`) take one path or a list of paths, as verl's do."""

from __future__ import annotations

from typing import Any


def file_list(value: Any) -> list[str]:
    """The paths a data-file key names: [] for None, [value] for one path, the list otherwise."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
