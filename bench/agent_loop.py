"""What the native engine's KV kept across turns saves in a multi-turn rollout, against prefilling each turn whole.

One run, same model, prompts and seed, two engines: `kept` (each trajectory's KV stays in the engine between turns;
a turn prefills only the last sampled token and the appended tool response) and `refill` (every turn prefills the
whole history again, what an engine without KV reuse does). A Qwen2-architecture model with random weights over the
char tokenizer; every turn ends at one of --stop_chars and calls a tool that answers with --response_chars
characters (a search result, a file), so histories grow by a tool response per turn. Trajectories are identical
in both runs up to float noise (counted); prints the prefill tokens computed, the tokens reused, and the median rollout seconds.

    .venv/bin/python bench/agent_loop.py     # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.rollout import agent_loop
from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings, left_pad
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.native import NativeRollout
from rlcore.tools.parser import ParsedCall
from rlcore.tools.runner import ToolResult


class FixedTools:
    """Every call answers with the same `length` characters (no processes: the bench measures the engine)."""

    def __init__(self, length: int) -> None:
        self.text = ("lorem ipsum " * length)[:length]

    def start(self, tools_kwargs):
        pass

    def execute(self, calls):
        return [ToolResult(self.text, None, {}, "ok") for _ in calls]

    def finish(self):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--max_tokens", type=int, default=768)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--response_chars", type=int, default=96)
    parser.add_argument("--stop_chars", default="0123456789")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0, eos_token_id=1)
    model_dir = tempfile.mkdtemp(prefix="bench_agent_loop_")
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(model_dir)
    agent_loop.PARSERS["every_turn"] = lambda text: [ParsedCall("lookup", {}, None)]
    settings = MultiTurnSettings(max_assistant_turns=args.turns, max_tool_response_length=args.response_chars, format="every_turn")
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": f"{i}+{i}="}], add_generation_prompt=True, tokenize=True)
            for i in range(args.trajectories // 4)]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rows], tokenizer.pad_token_id)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    stops = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(args.stop_chars))]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop_token_ids=stops, seed=7)
    results = {}
    for name, keep in (("refill", False), ("kept", True)):
        engine = NativeRollout(model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0)
        engine.update_weights(model.named_parameters())  # the engine builds the architecture only (as for a sync)
        engine.keeps_kv_across_calls = keep
        loop = AgentLoop(engine, tokenizer, FixedTools(args.response_chars), settings)
        seconds = []
        for _ in range(args.reps):
            start = time.perf_counter()
            out, counters = loop.run(ids, mask, sampling)
            seconds.append(time.perf_counter() - start)
        results[name] = out, counters, dict(loop.stats), statistics.median(seconds)
    (out_r, counters, stats_r, time_r), (out_k, _, stats_k, time_k) = results["refill"], results["kept"]
    # Kept KV was written by decode steps, recomputed KV by a prefill: equal to ~1e-6, which can flip a sampled token
    # somewhere in 64 x 700 draws, after which that trajectory differs.
    same = int((out_r.responses == out_k.responses).all(-1).sum())
    print(f"model: Qwen2 random, hidden {args.hidden}, {args.layers} layers; {args.trajectories} trajectories, "
          f"{counters['num_turns'].float().mean():.1f} turns each, {out_k.response_mask.sum(-1).float().mean():.0f} tokens each "
          f"({out_k.loss_mask.sum(-1).float().mean():.0f} sampled), tool responses of {args.response_chars} chars; torch threads 2")
    for name, (_, _, stats, secs) in results.items():
        print(f"{name:7s} prefill tokens computed {stats['agent/prefill_tokens']:8.0f}  reused {stats['agent/reused_tokens']:8.0f}  "
              f"engine calls {stats['agent/engine_calls']:.0f}  rollout {secs:.2f} s (median of {args.reps})")
    print(f"identical trajectories: {same} of {len(ids)}")
    print(f"kept / refill: prefill tokens x{stats_k['agent/prefill_tokens'] / stats_r['agent/prefill_tokens']:.3f}, "
          f"rollout time x{time_k / time_r:.3f}")


if __name__ == "__main__":
    main()
