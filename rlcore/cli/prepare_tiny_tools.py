"""Builds the tool-use demo's assets offline: the tiny_add3 task, the char tokenizer, a tiny Qwen2 and its warm-start.

    python -m rlcore.cli.prepare_tiny_tools --out_dir .cache/tiny_tools

Writes {out_dir}/data/{train,test,sft}.parquet (rlcore.data.synthetic_tools) and {out_dir}/sft_model (HF model +
tokenizer): a randomly initialised 0.55M Qwen2 trained on correct traces (add(a,b), its result, add(a+b,c), its
result, the sum) with the loss on the assistant messages only, until it reproduces `stop_exact_match` of the probe
traces under teacher forcing. The probe rows are training rows the SFT never saw; the test split is scored once, at
the end, for the report. The warm-start knows the format and often miscopies a digit: that is what GRPO with the
tool (recipes/tiny_cpu_tools.yaml) improves. Without the tool it would score ~0: it never writes a sum it did not
copy from a tool response. Idempotent: a finished build with the same settings is reused.

The SFT is a plain in-process loop (no Ray, no FSDP): the model is tiny and there is one process to feed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from transformers import Qwen2ForCausalLM

from rlcore.cli.prepare_tiny import one_builder, tiny_config
from rlcore.data.synthetic_tools import assistant_token_spans, tool_trace, write_task
from rlcore.data.tokenizer import build_char_tokenizer

SETTINGS = dict(
    num_train=20000, num_test=500, num_sft=4000, data_seed=0,
    hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    # prompt 16 + response 256 tokens (recipes/tiny_cpu_tools.yaml); the longest correct trace is 14 + 216.
    max_position_embeddings=272, model_seed=0,
    batch_size=32, lr=1e-3, warmup_steps=20, max_steps=1500, sft_seed=0,
    # Probe accuracy jumps from 0 to ~0.9 within ~100 steps, 0.23 -> 0.51 in 10 (steps 270, 280 in a measured run),
    # so it is checked often enough to stop near the threshold rather than far past it. A probe costs about one
    # training step. (lr 2e-3 was no faster: still on the loss plateau at step 200, where 1e-3 was past it.)
    eval_every=5,
    # ... once the batch loss is below this: no probe trace is reproduced before (measured: exact match 0.00 at every
    # probe through loss 0.0647, step 240), and the probes at higher losses took 15 s of the build's 95 s. Probes read
    # no RNG: the same steps run and the same model comes out (bit for bit, measured).
    probe_below_loss=0.1,
    probe_rows=100,  # the last training rows (never in the SFT traces): the stop rule is measured on them
    stop_exact_match=0.25,  # stop at the first probe evaluation with this share of traces exactly reproduced
)


def encode_traces(tokenizer, conversations: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids [rows, max_len] and the loss mask [rows, max_len]: 1 on assistant content + eos."""
    encoded = [assistant_token_spans(tokenizer, messages) for messages in conversations]
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((len(encoded), width), dtype=torch.bool)
    for row, (ids, spans) in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        for start, end in spans:
            loss_mask[row, start:end] = True
    return input_ids, loss_mask


def _token_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits [rows, len - 1, vocab]: position t predicts input_ids[:, t + 1]."""
    # Right padding needs no attention mask: pads come after every real token, so causal attention never sees them.
    return model(input_ids=input_ids).logits[:, :-1]


@torch.no_grad()
def teacher_forced_exact_match(model, input_ids: torch.Tensor, loss_mask: torch.Tensor, batch_size: int = 100) -> float:
    """Share of traces whose every assistant token is the argmax under teacher forcing.

    A greedy multi-turn rollout reproduces a trace exactly iff this holds for it (the tool responses in between
    are the tool's, not the model's), so this is greedy accuracy with the tool, at the cost of one forward pass.
    """
    model.eval()
    hits = 0
    for i in range(0, len(input_ids), batch_size):
        ids, mask = input_ids[i : i + batch_size], loss_mask[i : i + batch_size, 1:]
        wrong = (_token_logits(model, ids).argmax(-1) != ids[:, 1:]) & mask
        hits += int((~wrong.any(-1)).sum())
    model.train()
    return hits / len(input_ids)


def train_sft(model, train: tuple[torch.Tensor, torch.Tensor], probe: tuple[torch.Tensor, torch.Tensor], s: dict) -> dict:
    """AdamW with linear warm-up on the assistant tokens until probe exact match reaches s["stop_exact_match"]."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / s["warmup_steps"]))
    generator = torch.Generator().manual_seed(s["sft_seed"])
    input_ids, loss_mask = train
    order, cursor = torch.randperm(len(input_ids), generator=generator), 0
    result = dict(step=0, loss=math.nan, probe_exact_match=0.0)
    model.train()
    for step in range(1, s["max_steps"] + 1):
        if cursor + s["batch_size"] > len(order):  # a new epoch, reshuffled
            order, cursor = torch.randperm(len(input_ids), generator=generator), 0
        index = order[cursor : cursor + s["batch_size"]]
        cursor += s["batch_size"]
        ids, mask = input_ids[index], loss_mask[index, 1:]
        # Trim the batch's common right padding: ~10% of the sequence for free.
        width = int(mask.any(0).nonzero().max()) + 2
        ids, mask = ids[:, :width], mask[:, : width - 1]
        logits = _token_logits(model, ids)
        loss = F.cross_entropy(logits[mask], ids[:, 1:][mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step % s["eval_every"] == 0 and loss.item() < s["probe_below_loss"]) or step == s["max_steps"]:
            result = dict(step=step, loss=loss.item(), probe_exact_match=teacher_forced_exact_match(model, *probe))
            print(f"  sft step {step}: loss {result['loss']:.4f}, probe exact match {result['probe_exact_match']:.2f}", flush=True)
            if result["probe_exact_match"] >= s["stop_exact_match"]:
                break
    return result


def _conversations(rows: list[dict]) -> list[list[dict]]:
    """Prompt + correct trace of task rows (train / test rows have no `messages` column)."""
    return [[*row["prompt"], *tool_trace(row)] for row in rows]


def prepare(out_dir: str, settings: dict = SETTINGS) -> str:
    """Returns the SFT model directory, building it (and the data) unless a build with these settings exists."""
    with one_builder(out_dir):
        return _prepare(out_dir, settings)


def _prepare(out_dir: str, settings: dict) -> str:
    s = settings
    stamp_path, model_dir = os.path.join(out_dir, "settings.json"), os.path.join(out_dir, "sft_model")
    if os.path.isfile(stamp_path) and json.load(open(stamp_path)) == s and os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"tiny tool-use assets up to date in {out_dir}")
        return model_dir
    if s["num_sft"] + s["probe_rows"] > s["num_train"]:
        raise ValueError(f"num_sft={s['num_sft']} + probe_rows={s['probe_rows']} > num_train={s['num_train']}: the probe "
                         "rows (the last training rows) would overlap the SFT traces (the first); raise num_train")
    start = time.perf_counter()
    paths = write_task(os.path.join(out_dir, "data"), s["num_train"], s["num_test"], s["num_sft"], s["data_seed"])
    tokenizer = build_char_tokenizer()
    sft_rows = pq.read_table(paths["sft"]).to_pylist()
    train = encode_traces(tokenizer, [row["messages"] for row in sft_rows])
    if train[0].shape[1] > s["max_position_embeddings"]:
        raise ValueError(f"the longest SFT trace has {train[0].shape[1]} tokens, more than max_position_embeddings="
                         f"{s['max_position_embeddings']}; raise max_position_embeddings")
    probe = encode_traces(tokenizer, _conversations(pq.read_table(paths["train"]).to_pylist()[-s["probe_rows"]:]))
    torch.manual_seed(s["model_seed"])
    model = Qwen2ForCausalLM(tiny_config(tokenizer, s, s["max_position_embeddings"]))
    num_params = sum(p.numel() for p in model.parameters())
    result = train_sft(model, train, probe, s)
    test_exact_match = teacher_forced_exact_match(model, *encode_traces(tokenizer, _conversations(pq.read_table(paths["test"]).to_pylist())))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with open(stamp_path, "w") as f:
        json.dump(s, f)
    print(f"built tiny tool-use assets in {out_dir}: {num_params / 1e6:.2f}M params, SFT {result['step']} steps "
          f"(loss {result['loss']:.4f}), teacher-forced exact match on {s['probe_rows']} probe training rows "
          f"{result['probe_exact_match']:.3f}, on {s['num_test']} held-out test rows {test_exact_match:.3f}, "
          f"{time.perf_counter() - start:.1f}s")
    return model_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=".cache/tiny_tools")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    prepare(args.out_dir)


if __name__ == "__main__":
    main()
