"""verl's multimodal rows: a prompt whose text holds one `<image>` placeholder per image, the images in the
`data.image_key` column (each `{"bytes": ...}`, `{"path": ...}`, a path, or a PIL image).

The processor saved beside the model (AutoProcessor) renders the messages with image items and expands each image's
placeholder into its `<|image_pad|>` tokens (one per merged patch), so prompt lengths, `filter_overlong_prompts` and
the token budgets count image tokens. Each row is checked at load (every image decodes, as many placeholders as
images) with the dataset's all-problems-at-once report.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from rlcore.families.vision import IMAGE_PLACEHOLDER


def decode_image(value: Any):
    """A PIL RGB image from any of verl's image cells."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return Image.open(io.BytesIO(value["bytes"])).convert("RGB")
        value = value.get("path") or value.get("image")
    if isinstance(value, (str, os.PathLike)):
        with Image.open(os.path.expanduser(value)) as image:
            return image.convert("RGB")
    raise ValueError(f"an image cell must be {{'bytes': ...}}, {{'path': ...}}, a path or a PIL image, not {type(value).__name__}")


def image_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each message's text split at its `<image>` placeholders into image and text items (the processor's chat
    template renders an image item as the model's vision tokens)."""
    out = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            out.append(message)
            continue
        items: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i:
                items.append({"type": "image"})
            if text:
                items.append({"type": "text", "text": text})
        out.append({**message, "content": items})
    return out


def placeholder_count(messages: list[dict[str, Any]]) -> int:
    return sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


def image_row_check(prompt_key: str, image_key: str, video_key: str = "videos"):
    """A row check (rlcore.data.row_checks): the row's images decode, its prompt has one placeholder per image, and it
    has no videos (rlcore's vision-language path takes images)."""
    def check(row: dict[str, Any]) -> str | None:
        if row.get(video_key):
            return (f"the row has videos in {video_key}: rlcore trains vision-language models on images only; drop the "
                    "videos (or the rows)")
        images = row.get(image_key) or []
        if not isinstance(images, (list, tuple)):
            return f"{image_key} must be a list of images, got {type(images).__name__}"
        for i, image in enumerate(images):
            try:
                decode_image(image)
            except Exception as err:  # PIL raises several kinds for a broken file
                return f"{image_key}[{i}] does not decode as an image ({type(err).__name__}: {err})"
        placeholders = placeholder_count(row.get(prompt_key) or [])
        if placeholders != len(images):
            return (f"the prompt has {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) and {image_key} holds {len(images)} "
                    f"image(s): each image needs exactly one {IMAGE_PLACEHOLDER} where it goes in the text")
        return None
    return check


def process_row(processor, messages: list[dict[str, Any]], images: list[Any], **chat_kwargs) -> tuple[list[int], dict[str, torch.Tensor], list]:
    """(prompt ids with each image expanded into its tokens, the row's `multi_modal_inputs`, its PIL images)."""
    pil = [decode_image(image) for image in images]
    text = processor.apply_chat_template(image_messages(messages), add_generation_prompt=True, tokenize=False, **chat_kwargs)
    out = processor(text=[text], images=pil or None, return_tensors="pt")
    inputs = {k: out[k] for k in ("pixel_values", "image_grid_thw") if k in out}
    return out["input_ids"][0].tolist(), inputs, pil
