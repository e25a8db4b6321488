"""A vision-language model in the native engine: each prompt's images go through the tower once, at its prefill
(a group's n samples share that prefill, and with it the images' features in their copied KV), with the model's
own multimodal RoPE positions; decoding continues them, every new token one position further on all three rows
(time, height, width), from where the prompt's rope index ended (vLLM's and HF's generate's rule).

The engine hands this module the rows' processor tensors (`multi_modal_inputs`: pixel_values, image_grid_thw, as
the dataset made them) and asks it for the prefill's positions and tower inputs, and each decode step's positions.
"""

from __future__ import annotations

import torch

from rlcore.models.vision import rope_positions, rows_inputs


class ImageRows:
    """One generate() call's images: the rows' processor tensors and, per request row, how far its rope positions
    run ahead of its token count (an image's tokens advance height and width, not only time)."""

    def __init__(self, model: torch.nn.Module, inputs: list[dict | None], device: torch.device) -> None:
        self.model, self.inputs, self.device = model, inputs, device
        self.ahead = torch.zeros(len(inputs), dtype=torch.long, device=device)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, rows: list[int], n: int) -> tuple[torch.Tensor, dict]:
        """`[3, groups, len]` positions and the tower's inputs for the prompts of request rows `rows` (each the first
        of its group of n, left-padded in `ids`); records each group's offset for its n samples."""
        vision = rows_inputs([self.inputs[r] for r in rows], self.device)
        rope = rope_positions(self.model, ids, mask, vision.get("image_grid_thw"))
        ahead = rope.amax(dim=(0, 2)) + 1 - mask.sum(-1)  # the next position, less the tokens so far
        first = torch.tensor(rows, device=self.device)
        for j in range(n):
            self.ahead[first + j] = ahead
        return rope, vision

    def decode_positions(self, text_positions: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
        """`[3, rows, 1]`: each running slot's next position (its token count) moved on by its row's offset."""
        return (text_positions + self.ahead[req][:, None])[None].expand(3, -1, -1)
