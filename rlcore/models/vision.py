"""Vision-language models through HF's own modules: the batch's images into the forward, multimodal RoPE positions,
and the vision tower kept in step across FSDP2 ranks.

A row's images travel beside its tokens as the processor made them (`multi_modal_inputs`: `pixel_values`
`[patches, patch_dim]`, `image_grid_thw` `[images, 3]`); a micro-batch concatenates its rows' in row order, which is
the order the model scatters the tower's features into the `<|image_pad|>` tokens, padded or packed. Positions are
computed here, per micro-batch, from the tokens by the model's own `get_rope_index` (three rows: time, height,
width; text tokens advance all three together), so a batch cut by dynamic batch size or balanced by length needs no
positions carried for it. Packed, HF takes four rows `[4, 1, T]`: the text positions that restart per sequence
(which tell the attention where sequences end) and the three rope rows of each sequence, concatenated.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from rlcore.families.vision import FAMILIES, TINY_VISION, VISION_TOKENS

MULTI_MODAL_INPUTS = "multi_modal_inputs"  # verl's non-tensor column: one dict of processor tensors per row
# What a rollout engine may need of a row's images: the images themselves (vLLM processes them) or the processor's
# tensors (the native engine feeds them to the tower); each engine's generate() takes the one it uses.
MEDIA_COLUMNS = ("multi_modal_data", MULTI_MODAL_INPUTS)

# The tiny tokenizer's chat template with image items: a message's content is a string or a list of
# {"type": "image"} / {"type": "text", "text": ...} items (as verl builds them from `<image>` placeholders).
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|endoftext|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def build_vl_model_dir(path: str, shape: str, tokenizer, seed: int = 0, max_image_side: int = 8, text: dict | None = None,
                       vision: dict | None = None) -> str:
    """A tiny random vision-language model over `tokenizer` (the tiny task's character tokenizer: the four vision
    tokens and a chat template that renders image items are added to it) and its processor, saved as a real HF
    directory; returns `path`. `text` / `vision`: overrides of the tiny text / vision config (vLLM's CPU kernels
    want head dims of 32 and more).
    `max_image_side`: the largest image the processor keeps, in patches per side (larger ones are resized down)."""
    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor

    model_type = TINY_VISION[shape]
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(("vision_start", "vision_end", "image", "video"), VISION_TOKENS)}
    kwargs = FAMILIES[model_type].tiny
    text = dict(kwargs["text_config"], vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=None, **(text or {}))
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    third = head // 2 * 3 // 8  # mrope_section: the rotary half of a head split time : height : width as 2 : 3 : 3
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=[head // 2 - 2 * third, third, third])
    tower = dict(kwargs["vision_config"], **(vision or {}))
    config = AutoConfig.for_model(model_type, text_config=text, vision_config=tower, tie_word_embeddings=False,
                                  image_token_id=ids["image"], video_token_id=ids["video"], vision_start_token_id=ids["vision_start"],
                                  vision_end_token_id=ids["vision_end"])
    torch.manual_seed(seed)
    AutoModelForImageTextToText.from_config(config).save_pretrained(path)
    patch, merge = tower["patch_size"], tower["spatial_merge_size"]
    images = Qwen2VLImageProcessor(patch_size=patch, merge_size=merge, temporal_patch_size=2,
                                   min_pixels=(patch * merge) ** 2, max_pixels=(patch * max_image_side) ** 2)
    processor_cls = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])
    video_cls = getattr(transformers, VIDEO_PROCESSOR_MAPPING_NAMES[model_type]["torchvision"])
    processor = processor_cls(image_processor=images, tokenizer=tokenizer, video_processor=video_cls(patch_size=patch),
                              chat_template=VL_CHAT_TEMPLATE)
    processor.save_pretrained(path)
    return os.path.abspath(path)


def vision_processor(model_path: str, trust_remote_code: bool = False):
    """The processor of a vision-language model at `model_path`; None for a text-only model (its config.json has no
    vision_config)."""
    import json

    config = os.path.join(os.path.expanduser(model_path), "config.json")
    if not os.path.isfile(config):  # no model there (yet): whatever loads it says so, naming the key
        return None
    with open(config) as f:
        if "vision_config" not in json.load(f):
            return None
    return load_processor(model_path, trust_remote_code)


def load_processor(path: str, trust_remote_code: bool = False):
    """The processor saved beside the model (`AutoProcessor`, local files only)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(os.path.expanduser(path), local_files_only=True, trust_remote_code=trust_remote_code)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """HF's model under a LoRA (peft) wrapper, or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    return _unwrapped(model).model.language_model


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    return _unwrapped(model).model.visual


def rows_inputs(rows, device: torch.device) -> dict[str, torch.Tensor]:
    """The micro-batch's `pixel_values` / `image_grid_thw`: its rows' concatenated in row order; {} when no row of
    it has an image."""
    present = [r for r in rows if r and r.get("image_grid_thw") is not None and len(r["image_grid_thw"])]
    if not present:
        return {}
    return {key: torch.cat([torch.as_tensor(r[key]) for r in present]).to(device) for key in ("pixel_values", "image_grid_thw")}


def rope_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """`[3, batch, seq]` multimodal RoPE positions of padded rows, by the model's own get_rope_index (pads: 1)."""
    image_token = model.config.image_token_id
    kinds = (input_ids == image_token).int()
    if image_grid_thw is None:  # text only: the three rows are the text positions
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return positions.masked_fill(attention_mask == 0, 1)[None].expand(3, -1, -1)
    positions, _ = _unwrapped(model).model.get_rope_index(input_ids, kinds, image_grid_thw=image_grid_thw, attention_mask=attention_mask)
    return positions


def packed_positions(rope: torch.Tensor, text_positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`[4, 1, tokens]` for a packed forward: the text positions (restarting per sequence) over the rope rows."""
    mask = attention_mask.bool()
    return torch.cat([text_positions[mask][None], rope[:, mask]])[:, None]


def slice_image_features(model: torch.nn.Module, vision: dict[str, torch.Tensor], row_ids: torch.Tensor, start: int,
                         length: int) -> dict[str, Any]:
    """Ulysses: each rank of a sequence-parallel group runs the tower on all of the micro-batch's images (the same
    work on every rank, so the tower's FSDP2 collectives stay in step) and keeps the features of the image tokens in
    its slice `[start, start + length)` of the packed row `row_ids`; HF's forward then scatters them into the
    slice's image tokens (Qwen3-VL's deepstack features into its early layers alike). The model's forward kwargs."""
    out = _unwrapped(model).model.get_image_features(vision["pixel_values"], vision["image_grid_thw"], return_dict=True)
    is_image = row_ids == model.config.image_token_id
    mine = (is_image.long().cumsum(0) - 1)[start: start + length][is_image[start: start + length]]
    out["pooler_output"] = [torch.cat(out.pooler_output)[mine]]
    if getattr(out, "deepstack_features", None) is not None:
        out["deepstack_features"] = [[torch.cat(level)[mine]] for level in out.deepstack_features]
    return {"mm_encoder_outputs": {"image": out}}


class TowerAnchor:
    """Keeps the vision tower's FSDP2 collectives in step across ranks. A rank whose micro-batch has no image would
    skip the tower (HF runs it only for pixels) while a rank with images all-gathers its parameters in forward and
    reduce-scatters its gradients in backward: the collectives then mismatch (a crash on gloo, a hang on NCCL).
    Armed for such a micro-batch, a pre-hook on the language model (where HF's forward would have run the tower)
    runs it on a dummy image and adds zero times its outputs to the input embeddings, so the tower's parameters
    gather and get (zero) gradients in the same order on every rank; every output takes part (Qwen3-VL's deepstack
    features come from mergers of their own). One process: nothing to keep in step, never armed."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device, self.armed = model, device, False
        language_model(model).register_forward_pre_hook(self._hook, with_kwargs=True)

    def arm(self, no_image: bool) -> None:
        self.armed = no_image and dist.is_initialized() and dist.get_world_size() > 1

    def _hook(self, module, args, kwargs):
        if not self.armed:
            return None
        self.armed = False
        embeds = kwargs["inputs_embeds"]
        return args, {**kwargs, "inputs_embeds": embeds + self.zero().to(embeds.dtype)}

    def zero(self) -> torch.Tensor:
        tower, config = vision_tower(self.model), self.model.config.vision_config
        side = config.spatial_merge_size * 2  # the smallest grid the merger and Qwen2.5-VL's windows both take
        grid = torch.tensor([[1, side, side]], device=self.device)
        patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
        out = tower(torch.zeros(side * side, patch_dim, device=self.device), grid_thw=grid, return_dict=True)
        return sum(t.float().sum() for t in _tensors(out)) * 0.0


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif hasattr(value, "values"):
        for item in value.values():
            yield from _tensors(item)


def collapse_image_tokens(ids: list[int], image_token: int) -> list[int]:
    """A processor-expanded prompt with each image's run of `<|image_pad|>` tokens cut to one: vLLM expands an image's
    single placeholder itself, and expands an already expanded prompt again (a wrong prompt, no error)."""
    return [t for i, t in enumerate(ids) if t != image_token or i == 0 or ids[i - 1] != image_token]
