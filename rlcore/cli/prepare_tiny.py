"""Builds the embedded demo's assets offline: task data, tokenizer, a tiny Qwen2 model and its SFT warm-start.

    python -m rlcore.cli.prepare_tiny --out_dir .cache/tiny_cpu
    python -m rlcore.cli.prepare_tiny --moe --out_dir .cache/tiny_cpu_moe   # the same task on a tiny Qwen3-MoE

Writes {out_dir}/data/{train,test,sft,sft_probe}.parquet, {out_dir}/init_model (the randomly initialised model +
tokenizer) and {out_dir}/sft_model: the warm-start, trained by rlcore-sft (config/sft_tiny_cpu.yaml) until greedy
decoding solves 25% of 200 training problems; it is what the tiny_cpu recipe trains with RL. Idempotent: a
finished build with the same settings and SFT config is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from contextlib import contextmanager

import pyarrow.parquet as pq
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from rlcore.data.synthetic import write_parquet, write_task
from rlcore.data.tokenizer import build_char_tokenizer

# The task and the model. How the warm-start trains, and when it stops, is config/sft_tiny_cpu.yaml.
SETTINGS = dict(
    num_train=9500, num_test=500, min_digits=1, max_digits=2, data_seed=0,  # all 10k pairs a+b, a,b in 0..99
    hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    max_prompt_length=8, max_response_length=5, model_seed=0,  # longest prompt: <|user|>99+99=<|assistant|>
    sft_probe_rows=200,  # the last training rows: the warm-start's stop rule is measured on them
)
# The MoE demo (recipe tiny_cpu_moe): the same task and width on a Qwen3-MoE, 8 experts of 128, top-2 (head_dim 32).
MOE_SETTINGS = dict(SETTINGS, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128)


def sft_config(out_dir: str, *overrides: str):
    """config/sft_tiny_cpu.yaml with every path under `out_dir`."""
    from rlcore.train_sft import compose_sft

    d = os.path.abspath(os.path.expanduser(out_dir))
    return compose_sft([f"data.train_files=[{d}/data/sft.parquet]", f"data.val_files=[{d}/data/sft_probe.parquet]",
                        f"model.partial_pretrain={d}/init_model", f"trainer.default_local_dir={d}/sft_run/checkpoints",
                        f"trainer.export_dir={d}/sft_model", *overrides], "sft_tiny_cpu")


def tiny_config(tokenizer, s: dict, max_position_embeddings: int = 64) -> PretrainedConfig:
    """A small Qwen2 over the char tokenizer, sized by settings `s` (hidden/intermediate size, layers, heads); a
    Qwen3-MoE of the same width when `s` names experts (MOE_SETTINGS)."""
    experts = {k: s[k] for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size") if k in s}
    return AutoConfig.for_model(
        "qwen3_moe" if experts else "qwen2", vocab_size=len(tokenizer), hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"], num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        **(dict(experts, norm_topk_prob=True, head_dim=s["hidden_size"] // s["num_attention_heads"]) if experts else {}),
    )


@contextmanager
def one_builder(out_dir: str):
    """One builder of `out_dir` at a time (a pytest run, the benchmarks, `make train`): the others wait on
    `<out_dir>.lock`, then find the build up to date."""
    import fcntl

    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    with open(os.path.abspath(out_dir) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(out_dir: str, settings: dict = SETTINGS) -> str:
    """Returns the SFT model directory, building whatever is missing or stale."""
    with one_builder(out_dir):
        return _prepare(out_dir, settings)


def _prepare(out_dir: str, settings: dict) -> str:
    from rlcore.train_sft import run

    cfg = sft_config(out_dir)
    stamp = dict(settings, sft=OmegaConf.to_container(cfg, resolve=True))
    stamp_path, model_dir = os.path.join(out_dir, "settings.json"), cfg.trainer.export_dir
    if os.path.isfile(stamp_path) and json.load(open(stamp_path)) == stamp and os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"tiny assets up to date in {out_dir}")
        return model_dir
    start = time.perf_counter()
    s = settings
    paths = write_task(os.path.join(out_dir, "data"), s["num_train"], s["num_test"], s["min_digits"], s["max_digits"], s["data_seed"])
    write_parquet(pq.read_table(paths["sft"]).to_pylist()[-s["sft_probe_rows"]:], cfg.data.val_files[0])
    tokenizer = build_char_tokenizer()
    torch.manual_seed(s["model_seed"])
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, s))
    model.save_pretrained(cfg.model.path)
    tokenizer.save_pretrained(cfg.model.path)
    run_dir = os.path.dirname(cfg.trainer.default_local_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    final = run(cfg, run_dir)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    print(f"built tiny assets in {out_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, SFT {final['step']} steps "
          f"(loss {final['train/loss']:.3f}), greedy accuracy on {final['val/rows']} training problems {final['val/exact_match']:.3f}, "
          f"{time.perf_counter() - start:.1f}s")
    return model_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=".cache/tiny_cpu")
    parser.add_argument("--moe", action="store_true", help="a tiny Qwen3-MoE instead of the dense Qwen2 (recipe tiny_cpu_moe)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prepare(args.out_dir, MOE_SETTINGS if args.moe else SETTINGS)


if __name__ == "__main__":
    main()
