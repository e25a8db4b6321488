"""A vision-language model's tower in the memory plan (rlcore.plan.memory): its activations in a training or
log-prob micro-batch. Nothing in the config says how large the images are, but an image's merged tokens sit in the
prompt, which the dataset never truncates: a micro-batch's patches are at most its prompt tokens times the patches
each image token merges (4 for Qwen2.5-VL and Qwen3-VL). The plan takes that bound.

This module imports neither torch nor ray.
"""

from __future__ import annotations

from rlcore.families.vision import TowerShape

GIB = 2**30


def tower_activations(shape: TowerShape, prompt_tokens: int, compute: int, ckpt: bool, backward: bool) -> tuple[int, float]:
    """(patches, GiB) of the tower's activations for a micro-batch with `prompt_tokens` prompt tokens, images filling
    them. `backward`: the tower is trained (a frozen tower, like a forward-only role, keeps one block's transients);
    `ckpt`: its blocks are recomputed (HF checkpoints the tower's blocks with the language model's)."""
    patches = prompt_tokens * shape.patches_per_token
    h, f = shape.hidden, shape.mlp
    per_layer = compute * (8 * h + 4 * f)  # bytes per patch one block keeps for backward: q, k, v at full width
    if not backward:
        act = patches * compute * (2 * h + 2 * f)
    elif ckpt:
        act = shape.depth * patches * h * compute + patches * per_layer
    else:
        act = shape.depth * patches * per_layer
    return patches, act / GIB
