"""verl's custom data sampler (`data.sampler.*`): a user class that decides the order the training prompts are
drawn in, and, if it has `update(batch)`, hears about every step's batch to adapt that order (a curriculum).
rlcore/data/sampler.py loads and drives it."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class SamplerConfig:
    # a Python file (path/to/sampler.py) or an importable module (pkg://my_pkg.samplers) holding the class; null =
    # data.shuffle decides the order
    class_path: Optional[str] = None
    class_name: Optional[str] = None  # the class in it, built as Class(data_source=dataset, data_config=data)
