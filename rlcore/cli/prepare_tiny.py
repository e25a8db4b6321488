"""Builds the embedded demo's assets offline: task data, tokenizer, a tiny Qwen2 model and its SFT warm-start.

    python -m rlcore.cli.prepare_tiny --out_dir .cache/tiny_cpu

Writes {out_dir}/data/{train,test,sft}.parquet and {out_dir}/sft_model (HF model + tokenizer, what the
tiny_cpu recipe trains with RL). Idempotent: a finished build with the same settings is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.data.synthetic import write_task
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.trainer.sft import greedy_accuracy, read_sft_rows, tokenize_sft, train_sft

# The model, data and warm-start recipe of the demo. SFT stops as soon as greedy accuracy on held-out TRAINING
# problems reaches sft_target_accuracy: it teaches the answer format and leaves the model mostly wrong, so the
# held-out accuracy gain afterwards is RL's doing. (A fixed step count is fragile: accuracy jumps from ~5% to
# ~60% within ~100 SFT steps, at a step that varies with seed and machine.) The test split is never looked at.
SETTINGS = dict(
    num_train=9500, num_test=500, min_digits=1, max_digits=2, data_seed=0,  # all 10k pairs a+b, a,b in 0..99
    hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    max_prompt_length=8, max_response_length=5, model_seed=0,  # longest prompt: <|user|>99+99=<|assistant|>
    sft_max_steps=1000, sft_batch_size=64, sft_lr=1e-3, sft_target_accuracy=0.25, sft_eval_rows=200, sft_eval_every=10,
)


def tiny_config(tokenizer, s: dict) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], max_position_embeddings=64, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )


def prepare(out_dir: str, settings: dict = SETTINGS) -> str:
    """Returns the SFT model directory, building whatever is missing or stale."""
    stamp_path = os.path.join(out_dir, "settings.json")
    model_dir = os.path.join(out_dir, "sft_model")
    if os.path.isfile(stamp_path) and json.load(open(stamp_path)) == settings and os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"tiny assets up to date in {out_dir}")
        return model_dir
    start = time.perf_counter()
    s = settings
    paths = write_task(os.path.join(out_dir, "data"), s["num_train"], s["num_test"], s["min_digits"], s["max_digits"], s["data_seed"])
    tokenizer = build_char_tokenizer()
    torch.manual_seed(s["model_seed"])
    model = Qwen2ForCausalLM(tiny_config(tokenizer, s))
    rows = read_sft_rows(paths["sft"])
    data = tokenize_sft(rows, tokenizer, s["max_prompt_length"], s["max_response_length"])
    probe_rows = rows[-s["sft_eval_rows"]:]  # training problems: the stop rule never sees the test split
    accuracy = [0.0]

    def reached_target(step: int) -> bool:
        accuracy[0] = greedy_accuracy(model, tokenizer, probe_rows, s["max_prompt_length"], s["max_response_length"])
        return accuracy[0] >= s["sft_target_accuracy"]

    losses = train_sft(model, data, s["sft_max_steps"], s["sft_batch_size"], s["sft_lr"], seed=s["model_seed"],
                       stop_fn=reached_target, stop_every=s["sft_eval_every"])
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with open(stamp_path, "w") as f:
        json.dump(settings, f)
    print(f"built tiny assets in {out_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
          f"SFT {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, train-pool greedy accuracy {accuracy[0]:.3f}, "
          f"{time.perf_counter() - start:.1f}s")
    return model_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=".cache/tiny_cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prepare(args.out_dir)


if __name__ == "__main__":
    main()
