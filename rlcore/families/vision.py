"""Vision-language families: what rlcore knows of a model that sees images (Qwen2.5-VL, Qwen3-VL).

A vision-language checkpoint is a language model (its `text_config`, planned like any text family) plus a vision
tower whose features replace the image placeholder tokens, positioned by multimodal RoPE (three position ids per
token: time, height, width). HF's own modules run both on FSDP2 (rlcore.models.vision); this record holds the facts
the rest of rlcore reads before any torch import: the tower's size knobs, whether it feeds features into several
language layers (Qwen3-VL's deepstack), and the tiny configs the CPU suite builds. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The placeholder tokens of the Qwen-VL chat format; the tiny tokenizer adds them after its characters.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PLACEHOLDER = "<image>"  # verl's placeholder in a row's prompt text, one per image of the row


@dataclass(frozen=True)
class VisionFamily:
    model_type: str
    summary: str
    deepstack: bool       # the tower's intermediate features also enter early language layers (Qwen3-VL)
    text_family: str      # the text family whose block its language model is (the plan counts it as that family's)
    tiny: dict[str, Any]  # text_config / vision_config kwargs of a tiny model (over the tiny tokenizer's vocabulary)


_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=512, tie_word_embeddings=False)
_TOWER = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, spatial_merge_size=2, temporal_patch_size=2,
              out_hidden_size=64)

FAMILIES: dict[str, VisionFamily] = {f.model_type: f for f in (
    VisionFamily("qwen2_5_vl", "Qwen2.5-VL (windowed ViT tower, 14-pixel patches merged 2 x 2)", deepstack=False, text_family="qwen2",
                 tiny=dict(text_config=dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                     "mrope_section": [2, 3, 3]}),
                           vision_config=dict(_TOWER, patch_size=14, fullatt_block_indexes=[1], window_size=56))),
    VisionFamily("qwen3_vl", "Qwen3-VL (16-pixel patches merged 2 x 2, deepstack features into early layers)",
                 deepstack=True, text_family="qwen3",
                 tiny=dict(text_config=dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                     "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
                           vision_config=dict(_TOWER, patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0]))),
)}
@dataclass(frozen=True)
class TowerShape:
    """What a vision tower's activations scale with: its width, MLP width and depth, and how many patches merge
    into one image token of the language model (spatial_merge_size squared)."""

    hidden: int
    mlp: int
    depth: int
    patches_per_token: int


def tower_shape(config: dict[str, Any]) -> TowerShape | None:
    """The vision tower's shape from config.json; None for a text-only model."""
    if vision_family(config) is None:
        return None
    v = config["vision_config"]
    return TowerShape(v["hidden_size"], v["intermediate_size"], v["depth"], v["spatial_merge_size"] ** 2)


def tower_params(config: dict[str, Any]) -> int:
    """The vision tower's parameters (patch embedding, blocks, the merger into the language model's width, and
    Qwen3-VL's position table and deepstack mergers), from config.json; 0 for a text-only model."""
    family, v = vision_family(config), config.get("vision_config") or {}
    if family is None:
        return 0
    h, i, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    merged = h * v["spatial_merge_size"] ** 2
    patch = v.get("in_channels", 3) * v["temporal_patch_size"] * v["patch_size"] ** 2 * h
    attention = 3 * h * h + 3 * h + h * h + h

    def merger(norm: int) -> int:
        return norm + merged * merged + merged + merged * out + out

    if family.deepstack:  # Qwen3-VL: LayerNorms, a 2-layer MLP, a biased patch conv, a position table
        block = 4 * h + attention + 2 * h * i + i + h
        deepstack = len(v.get("deepstack_visual_indexes") or ()) * merger(2 * merged)
        return patch + h + v["num_position_embeddings"] * h + v["depth"] * block + merger(2 * h) + deepstack
    block = 2 * h + attention + 2 * (h * i + i) + i * h + h  # Qwen2.5-VL: RMSNorms, SwiGLU
    return patch + v["depth"] * block + merger(h)


TINY_VISION = {f"tiny-{name.replace('_', '-')}": name for name in FAMILIES}  # "tiny-qwen2-5-vl" -> "qwen2_5_vl"


def vision_family(config: dict[str, Any]) -> VisionFamily | None:
    """The vision-language family of a config.json, or None for a text-only model."""
    return FAMILIES.get(config.get("model_type")) if "vision_config" in config else None


# The config keys of the placeholder tokens a vision-language model's prompts carry around each image / video.
PLACEHOLDER_KEYS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")


def placeholder_token_ids(config) -> tuple[int, ...]:
    """The image / video placeholder ids of a vision-language model's config (an HF config or its dict); () for a
    text-only model. No response may hold one: the model would take it for an image the row does not have (HF's
    forward fails on the count, its rope index on the positions), so the rollout never samples them and the
    training head leaves them out of its softmax alike."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    if get("vision_config") is None:
        return ()
    return tuple(sorted({int(get(key)) for key in PLACEHOLDER_KEYS if get(key) is not None}))


def vision_problems(config: dict[str, Any], strategy: str, rollout: str | None = None) -> list[str]:
    """Why rlcore cannot train this vision-language model with `strategy` and roll it out with `rollout` (None: not
    asked); empty when it can (FSDP2, with vLLM or the native engine)."""
    model_type = config.get("model_type")
    if vision_family(config) is None:
        return [f"model_type={model_type!r} is a vision-language model rlcore has no module for (it trains "
                f"{', '.join(sorted(FAMILIES))}); use one of those or a text-only checkpoint (docs/models.md)"]
    problems = []
    if strategy == "megatron":
        problems.append(f"model_type={model_type!r} on megatron: megatron-core 0.16 has no Qwen-VL vision tower or multimodal "
                        "RoPE in rlcore's build; use actor_rollout_ref.actor.strategy=fsdp2")
    return problems
