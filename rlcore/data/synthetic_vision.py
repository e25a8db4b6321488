"""The synthetic `tiny_colour` task: a small rendered image with one coloured square on grey, "what colour is the
square?" -> its colour's name, written as parquet in verl's multimodal row format (the image as PNG bytes in `images`,
one `<image>` in the prompt). A vision-language model can only answer from the image: the prompt is the same for
every row.

Usage: python -m rlcore.data.synthetic_vision --out_dir ~/data/tiny_colour [--num_train 512 --num_test 64]
"""

from __future__ import annotations

import argparse
import io
import os
from typing import Any

import numpy as np
from PIL import Image

from rlcore.data.synthetic import write_parquet

TASK_NAME = "tiny_colour"
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220), "yellow": (230, 210, 30)}
QUESTION = "<image>What colour is the square?"
SIZES = (28, 56)  # pixels per side: one or two 28-pixel merged patches of the Qwen-VL towers


def render(colour: str, size: int, rng: np.random.Generator) -> bytes:
    """A grey `size` x `size` image with a square of `colour` (a third to a half of the side) somewhere in it."""
    pixels = np.full((size, size, 3), 128, dtype=np.uint8)
    side = int(rng.integers(size // 3, size // 2 + 1))
    top, left = (int(v) for v in rng.integers(0, size - side + 1, 2))
    pixels[top: top + side, left: left + side] = COLOURS[colour]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def make_rows(num_rows: int, seed: int, split: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    rows = []
    for index in range(num_rows):
        colour = names[int(rng.integers(len(names)))]
        rows.append({
            "data_source": TASK_NAME,
            "prompt": [{"role": "user", "content": QUESTION}],
            "images": [{"bytes": render(colour, SIZES[int(rng.integers(len(SIZES)))], rng)}],
            "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": colour},
            "extra_info": {"split": split, "index": index, "answer": colour},
        })
    return rows


def write_task(out_dir: str, num_train: int = 512, num_test: int = 64, seed: int = 0) -> dict[str, str]:
    """train.parquet / test.parquet for RL, and sft.parquet (prompt, response = the colour, images) from other draws
    for a warm-start (verl's sft_vlm rows)."""
    out = os.path.expanduser(out_dir)
    paths = {split: os.path.join(out, f"{split}.parquet") for split in ("train", "test", "sft")}
    write_parquet(make_rows(num_train, seed, "train"), paths["train"])
    write_parquet(make_rows(num_test, seed + 1, "test"), paths["test"])
    sft = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"], "images": r["images"]}
           for r in make_rows(num_train, seed + 2, "sft")]
    write_parquet(sft, paths["sft"])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="~/data/tiny_colour")
    parser.add_argument("--num_train", type=int, default=512)
    parser.add_argument("--num_test", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = write_task(args.out_dir, args.num_train, args.num_test, args.seed)
    print(f"wrote {', '.join(paths.values())}")


if __name__ == "__main__":
    main()
