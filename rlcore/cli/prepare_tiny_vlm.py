"""Builds the vision-language demo's assets offline: the tiny_colour task, a tiny Qwen2.5-VL and its warm-start.

    python -m rlcore.cli.prepare_tiny_vlm --out_dir .cache/tiny_vlm

Writes {out_dir}/data/{train,test,sft}.parquet (rlcore.data.synthetic_vision: "what colour is the square?" on a
small rendered image, verl's multimodal rows) and {out_dir}/sft_model (HF model + processor): a randomly initialised
Qwen2.5-VL (2 language layers of width 128, a 2-block tower; head dims vLLM's CPU kernels take) trained on the SFT
rows with the loss on the answer only, until it answers with a colour's name on `stop_format` of the probe rows,
greedily. The SFT rows' answers are shuffled among them, so they teach what an answer looks like and nothing of the
image: supervised on the true answers this model reads the colour within 40 steps (probe accuracy 1.00, measured),
which would leave GRPO nothing to show. The warm-start answers one colour whatever the image (about a quarter
right); GRPO (recipes/tiny_cpu_vlm.yaml, `make train-vlm`) must teach it to look. The probe rows are training rows
the SFT never saw. Idempotent: a finished build with the same settings is reused.

The SFT is a plain in-process loop over HF's own forward (no Ray, no FSDP): the model is tiny and there is one
process to feed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from rlcore.cli.prepare_tiny import one_builder
from rlcore.data.multimodal import process_row
from rlcore.data.synthetic_vision import COLOURS, write_task
from rlcore.data.tokenizer import build_char_tokenizer

SETTINGS = dict(
    num_train=4096, num_test=256, data_seed=0, model_seed=0,
    text=dict(hidden_size=128, intermediate_size=256, head_dim=32), vision=dict(hidden_size=64, out_hidden_size=128),
    batch_size=32, lr=1e-3, max_steps=400, sft_seed=0,
    eval_every=10,
    probe_rows=64,  # the last training rows (never in the SFT rows: those are other draws)
    stop_format=0.9,  # stop at the first probe with this share of greedy answers a colour's name
    shuffle_answers=True,  # the SFT answers carry no information about the image (see above)
)


def encode_rows(processor, rows: list[dict], answers: list[str] | None) -> list[dict]:
    """Each row as the model takes it: prompt ids (image expanded) + answer ids + eos, the answer's positions in the
    loss, the processor's pixel tensors. `answers` None: prompts only (for generation)."""
    tokenizer = processor.tokenizer
    encoded = []
    for index, row in enumerate(rows):
        ids, inputs, _ = process_row(processor, row["prompt"], row["images"])
        answer = [] if answers is None else [*tokenizer.encode(answers[index], add_special_tokens=False), tokenizer.eos_token_id]
        encoded.append(dict(ids=ids + answer, start=len(ids), **inputs))
    return encoded


def collate(rows: list[dict], pad_id: int, left: bool = False) -> dict[str, torch.Tensor]:
    """Padded ids and mask (right for training, left for generation), the rows' pixels concatenated in row order."""
    width = max(len(row["ids"]) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(width - len(row["ids"]), width) if left else slice(0, len(row["ids"]))
        ids[i, span], mask[i, span] = torch.tensor(row["ids"]), 1
    return dict(input_ids=ids, attention_mask=mask, pixel_values=torch.cat([row["pixel_values"] for row in rows]),
                image_grid_thw=torch.cat([row["image_grid_thw"] for row in rows]))


@torch.no_grad()
def probe(model, processor, rows: list[dict], truths: list[str]) -> dict[str, float]:
    """Answers of the probe rows sampled at temperature 1 (as GRPO samples): the share that is any colour's name
    (format); and greedy: the share that is the right one (accuracy)."""
    model.eval()
    batch = collate(rows, processor.tokenizer.pad_token_id, left=True)
    shares = {}
    for name, sample in (("format", True), ("accuracy", False)):
        torch.manual_seed(0)
        out = model.generate(**batch, max_new_tokens=8, do_sample=sample, temperature=1.0, top_k=0, top_p=1.0,
                             pad_token_id=processor.tokenizer.pad_token_id)
        answers = [a.strip() for a in processor.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)]
        hits = [a in COLOURS for a in answers] if sample else [a == t for a, t in zip(answers, truths)]
        shares[name] = sum(hits) / len(hits)
    model.train()
    return shares


def train_sft(model, processor, train: list[dict], probe_rows: list[dict], probe_truths: list[str], s: dict) -> dict:
    """AdamW on the answer tokens until the probe's format share reaches s["stop_format"]."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(s["sft_seed"])
    order, cursor = torch.randperm(len(train), generator=generator), 0
    result = dict(step=0, loss=float("nan"), format=0.0, accuracy=0.0)
    for step in range(1, s["max_steps"] + 1):
        if cursor + s["batch_size"] > len(order):  # a new epoch, reshuffled
            order, cursor = torch.randperm(len(train), generator=generator), 0
        rows = [train[int(i)] for i in order[cursor: cursor + s["batch_size"]]]
        cursor += s["batch_size"]
        batch = collate(rows, processor.tokenizer.pad_token_id)
        logits = model(**batch, use_cache=False).logits[:, :-1]
        target = batch["input_ids"][:, 1:]
        in_loss = torch.zeros_like(target, dtype=torch.bool)
        for i, row in enumerate(rows):
            in_loss[i, row["start"] - 1: len(row["ids"]) - 1] = True  # position t predicts token t + 1
        loss = F.cross_entropy(logits[in_loss], target[in_loss])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % s["eval_every"] == 0 or step == s["max_steps"]:
            result = dict(step=step, loss=loss.item(), **probe(model, processor, probe_rows, probe_truths))
            print(f"  sft step {step}: loss {result['loss']:.4f}, probe format {result['format']:.2f}, "
                  f"accuracy {result['accuracy']:.2f}", flush=True)
            if result["format"] >= s["stop_format"]:
                break
    return result


def prepare(out_dir: str, settings: dict = SETTINGS) -> str:
    """Returns the SFT model directory, building it (and the data) unless a build with these settings exists."""
    with one_builder(out_dir):
        return _prepare(out_dir, settings)


def _prepare(out_dir: str, s: dict) -> str:
    from transformers import AutoModelForImageTextToText

    from rlcore.models.vision import build_vl_model_dir, load_processor

    stamp_path, model_dir = os.path.join(out_dir, "settings.json"), os.path.join(out_dir, "sft_model")
    if os.path.isfile(stamp_path) and json.load(open(stamp_path)) == s and os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"tiny vision-language assets up to date in {out_dir}")
        return model_dir
    start = time.perf_counter()
    paths = write_task(os.path.join(out_dir, "data"), s["num_train"], s["num_test"], s["data_seed"])
    base_dir = build_vl_model_dir(os.path.join(out_dir, "base_model"), "tiny-qwen2-5-vl", build_char_tokenizer(), seed=s["model_seed"],
                                  text=s["text"], vision=s["vision"])
    processor = load_processor(base_dir)
    sft_rows = pq.read_table(paths["sft"]).to_pylist()
    answers = [row["response"] for row in sft_rows]
    if s["shuffle_answers"]:
        answers = [answers[int(i)] for i in torch.randperm(len(answers), generator=torch.Generator().manual_seed(s["sft_seed"]))]
    train = encode_rows(processor, sft_rows, answers)
    held = pq.read_table(paths["train"]).to_pylist()[-s["probe_rows"]:]
    probe_rows = encode_rows(processor, held, None)
    torch.manual_seed(s["model_seed"])
    model = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    result = train_sft(model, processor, train, probe_rows, [row["reward_model"]["ground_truth"] for row in held], s)
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)
    json.dump(s, open(stamp_path, "w"), indent=1)
    print(f"tiny vision-language assets in {out_dir} ({time.perf_counter() - start:.0f} s): warm-start after {result['step']} "
          f"SFT steps, probe format {result['format']:.2f}, accuracy {result['accuracy']:.2f}")
    return model_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=".cache/tiny_vlm")
    args = parser.parse_args(argv)
    prepare(args.out_dir)


if __name__ == "__main__":
    main()
