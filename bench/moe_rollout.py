"""A mixture of experts through the native rollout engine against HF `generate`: parity and tokens/s, in one run.

The model is random-initialised in memory: on CUDA in bf16 the `qwen3-30b-a3b-l8` shape (Qwen3-30B-A3B's layer:
2048 hidden, 128 experts of 768, top-8; 8 of its 48 layers), on CPU the tiny Qwen3-MoE in fp32. The engine decodes
with that model object (no copy), so both sides run the same weights and HF's own MoE modules. Prints:

- parity, greedy: rows whose tokens equal HF generate's, the mean length of the common prefix, and the largest
  |rollout log-prob - training forward's| on the assembled batch (fp32 ~1e-6; bf16 differs by its rounding);
- tokens/s at temperature 1 over bench/rollout.py's length cases, native (with and without R3's route recording)
  against HF generate, median of --reps calls.

    .venv/bin/python bench/moe_rollout.py --reps 1          # CPU, tiny model, ~20 s
    python3 bench/moe_rollout.py                            # CUDA: the 30B-A3B layer shape in bf16
"""

from __future__ import annotations

import os

import torch
from rollout import length_case_parser, length_cases, time_calls

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.models.random_init import build_config
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout


def build(shape: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = build_config(shape, build_char_tokenizer())
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def prompts(vocab: int, count: int, n: int, length: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random prompts of 8-`length` tokens, each repeated n times, left-padded (id 0)."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, length + 1, (count,), generator=generator)
    ids = torch.randint(4, vocab, (count, length), generator=generator)
    mask = (torch.arange(length)[None] >= length - lengths[:, None]).long()
    return (ids * mask).repeat_interleave(n, 0), mask.repeat_interleave(n, 0)


def parity(model, engine: NativeRollout, ids: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> dict[str, float]:
    out = engine.generate(ids, mask, SamplingParams(max_tokens=max_tokens, do_sample=False))
    with torch.no_grad():
        hf = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
                            eos_token_id=None)[:, ids.shape[1]:]
        # The engine hands its output back on the host (as to the workers); the prompts here live on the model's device.
        seq = {k: v.to(ids.device) for k, v in assemble_sequences(ids.cpu(), mask.cpu(), out).items()}
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    trained = gather_log_probs(response_logits(logits.float(), max_tokens), out.responses.to(logits.device)).cpu()
    same = (out.responses == hf.cpu()).int()
    prefix = same.cumprod(-1).sum(-1).float()
    return {"rows_equal": float((prefix == max_tokens).float().mean()), "common_prefix": float(prefix.mean()),
            "max_log_prob_diff": float((trained - out.response_log_probs).abs().max())}


def main(argv: list[str] | None = None) -> None:
    parser = length_case_parser(__doc__)
    parser.add_argument("--shape", default=None, help="default: qwen3-30b-a3b-l8 on CUDA, tiny-qwen3-moe on CPU")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    if not cuda:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    shape = args.shape or ("qwen3-30b-a3b-l8" if cuda else "tiny-qwen3-moe")
    model = build(shape, dtype, device)
    ids, mask = (t.to(device) for t in prompts(model.config.vocab_size, args.prompts, args.n))
    engines = {r3: NativeRollout(None, 0, device, seed=0, model=model, record_routes=r3) for r3 in (False, True)}
    total = sum(p.numel() for p in model.parameters())
    print(f"{shape}: {total / 1e6:.1f}M parameters, {model.config.num_experts} experts top-{model.config.num_experts_per_tok}, "
          f"{dtype}, {device}{' (' + torch.cuda.get_device_name() + ')' if cuda else ''}; {ids.shape[0]} sequences "
          f"({args.prompts} prompts x {args.n}), <= {args.max_tokens} tokens; median of {args.reps}")
    for r3, engine in engines.items():
        result = parity(model, engine, ids, mask, args.max_tokens)
        print(f"parity{' (R3 recording)' if r3 else ''}: greedy rows equal to HF generate {result['rows_equal']:.2f}, common prefix "
              f"{result['common_prefix']:.1f} of {args.max_tokens} tokens, max |log-prob - training forward| {result['max_log_prob_diff']:.1e}")
    print(f"{'case':10s} {'mean length':>11s} {'HF generate tok/s':>18s} {'native tok/s':>13s} {'+ R3 tok/s':>11s} {'ratio':>6s}")
    for case, sp, hf in length_cases(args, model, ids, mask):
        hf_s, hf_tokens = time_calls(hf, args.reps)
        rates = {}
        for r3, engine in engines.items():
            seconds, tokens = time_calls(lambda engine=engine: int(engine.generate(ids, mask, sp).response_mask.sum()), args.reps)
            rates[r3] = tokens / seconds
        print(f"{case:10s} {tokens / ids.shape[0]:11.1f} {hf_tokens / hf_s:18.0f} {rates[False]:13.0f} {rates[True]:11.0f} "
              f"{rates[False] / (hf_tokens / hf_s):5.2f}x")


if __name__ == "__main__":
    main()
