"""A MoE layer's expert weights under their two names.

transformers 5 keeps each layer's routed experts as two fused 3-D parameters, `<layer>.mlp.experts.gate_up_proj`
`[experts, 2 x moe_intermediate, hidden]` (each expert's gate rows, then its up rows) and `.down_proj`
`[experts, hidden, moe_intermediate]`; its checkpoints (save_pretrained, the hub) and vLLM's loaders name one 2-D
tensor per expert and projection, `<layer>.mlp.experts.<e>.{gate,up,down}_proj.weight`. The training engines and the
native rollout hold the fused form (HF's own modules); what leaves the process as a checkpoint goes out per expert,
and what comes in per expert is read piece by piece into the fused rows (rlcore.engine.sharded_load).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

from rlcore.families import family_of

_FUSED = re.compile(r"^(?P<experts>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)$")


def is_fused(name: str) -> bool:
    return _FUSED.match(name) is not None


def expert_pieces(name: str, expert: int, rows: int) -> list[tuple[str, int, int]] | None:
    """The checkpoint tensors that fill expert `expert`'s `[rows, cols]` matrix of fused parameter `name`, each as
    (checkpoint name, first row, number of rows): gate_up_proj = gate_proj's rows then up_proj's; down_proj is one
    piece. None when `name` is not a fused expert parameter."""
    match = _FUSED.match(name)
    if match is None:
        return None
    prefix = f"{match['experts']}.{expert}"
    if match["proj"] == "down_proj":
        return [(f"{prefix}.down_proj.weight", 0, rows)]
    return [(f"{prefix}.gate_proj.weight", 0, rows // 2), (f"{prefix}.up_proj.weight", rows // 2, rows // 2)]


def splits_experts(config: dict) -> bool:
    """Whether the family's checkpoints name one tensor per expert (Qwen MoE, DeepSeek-V3, GLM-4.5, Qwen3-Next) rather
    than the fused ones HF trains (GPT-OSS); a MoE without a family module keeps HF's fused names."""
    family = family_of(config)
    return family is not None and family.is_moe and family.split_experts


def to_checkpoint_names(named: Iterable[tuple[str, torch.Tensor]], split: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with each fused expert parameter split into its per-expert checkpoint tensors (views, no copy);
    every other tensor passes through (every one of them when not `split`: splits_experts)."""
    for name, tensor in named:
        if not split or not is_fused(name):
            yield name, tensor
            continue
        for expert in range(tensor.shape[0]):
            for piece, first_row, rows in expert_pieces(name, expert, tensor.shape[1]):
                yield piece, tensor[expert, first_row : first_row + rows]
