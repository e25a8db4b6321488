"""The synthetic `tiny_add3` task: "a+b+c=" with three 3-digit numbers, solved with an `add(a, b)` tool.

A tiny model cannot add three 3-digit numbers in its head, but it can learn to copy digits into two tool calls and
the final result out of the second one. Rows are in verl's format (like rlcore.data.synthetic):

    {"data_source": "tiny_add3", "prompt": [{"role": "user", "content": "123+456+789="}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "1368"},
     "extra_info": {"split": "train", "index": 0, "answer": "1368"}}

`extra_info` has no `tools_kwargs`: the add tool takes no per-row arguments, parquet cannot store the empty struct
`{}` ("struct type with no child field"), and verl reads a missing `extra_info.tools_kwargs` as `{}`.

A correct trajectory, the one the SFT traces teach (`tool_trace`), adds left to right:

    assistant  <tool_call>{"name":"add","arguments":{"a":123,"b":456}}</tool_call>
    tool       579
    assistant  <tool_call>{"name":"add","arguments":{"a":579,"b":789}}</tool_call>
    tool       1368
    assistant  1368
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlcore.data.synthetic import task_row, write_parquet

TASK_NAME = "tiny_add3"
OPERAND_LOW, OPERAND_HIGH = 100, 999  # every operand has exactly three digits
TOOL_NAME = "add"


def make_add3_rows(num_rows: int, seed: int, exclude: frozenset[tuple[int, int, int]] = frozenset(),
                   split: str = "train") -> list[dict[str, Any]]:
    """Returns num_rows distinct problems a+b+c (a, b, c uniform in 100..999), never a triple in `exclude`.

    The 900**3 = 729M triples are far more than any split needs, so triples are drawn with replacement and
    duplicates or excluded ones redrawn.
    """
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    rng = np.random.default_rng(seed)
    triples: dict[tuple[int, int, int], None] = {}  # a dict keeps the draw order, so the rows are reproducible
    while len(triples) < num_rows:
        for t in rng.integers(OPERAND_LOW, OPERAND_HIGH + 1, size=(num_rows - len(triples), 3)).tolist():
            if tuple(t) not in exclude:
                triples.setdefault(tuple(t), None)
    return [task_row(TASK_NAME, f"{a}+{b}+{c}=", str(a + b + c), split, index) for index, (a, b, c) in enumerate(triples)]


def row_operands(row: dict[str, Any]) -> tuple[int, int, int]:
    """Parses (a, b, c) back out of a tiny_add3 row's prompt."""
    a, b, c = row["prompt"][-1]["content"].rstrip("=").split("+")
    return int(a), int(b), int(c)


def tool_call(a: int, b: int) -> str:
    """One hermes-format call of the add tool, compact JSON (no spaces: fewer tokens to copy)."""
    call = {"name": TOOL_NAME, "arguments": {"a": a, "b": b}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def tool_trace(row: dict[str, Any]) -> list[dict[str, str]]:
    """The correct trajectory after the prompt, as chat messages: add(a, b), add(a+b, c), then the sum."""
    a, b, c = row_operands(row)
    return [
        {"role": "assistant", "content": tool_call(a, b)},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": tool_call(a + b, c)},
        {"role": "tool", "content": str(a + b + c)},
        {"role": "assistant", "content": str(a + b + c)},
    ]


def assistant_token_spans(tokenizer, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's token ids and the [start, end) span of each assistant message's content + eos.

    Rendered prefix by prefix with the chat template, so a span is exactly what the template adds for that message
    after its `<|assistant|>` marker; the marker, the prompt and tool responses fall outside every span (no loss).
    """
    def ids(prefix, generation_prompt=False):
        out = tokenizer.apply_chat_template(list(prefix), add_generation_prompt=generation_prompt, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            # Up to and including the `<|assistant|>` that prompts this message, then the message itself.
            start, end = len(ids(messages[:i], generation_prompt=True)), len(ids(messages[: i + 1]))
            spans.append((start, end))
    full = ids(messages)
    # The template must render a prefix as a prefix of the whole; otherwise the spans point at the wrong tokens.
    assert all(end <= len(full) for _, end in spans), (spans, len(full))
    return full, spans


def write_task(out_dir: str, num_train: int, num_test: int, num_sft: int, seed: int) -> dict[str, str]:
    """Writes train.parquet, test.parquet and sft.parquet under out_dir; returns {"train"|"test"|"sft": path}.

    The test triples are drawn first and excluded from train. sft.parquet holds the first num_sft train rows with a
    `messages` column: prompt + tool_trace, the full conversation the warm-start learns.
    """
    if not 0 < num_sft <= num_train:
        raise ValueError(f"need 0 < num_sft <= num_train, got num_sft={num_sft}, num_train={num_train}")
    out_dir = os.path.expanduser(out_dir)
    test_rows = make_add3_rows(num_test, seed, split="test")
    # seed + 1 so train is not just a continuation of the test stream.
    train_rows = make_add3_rows(num_train, seed + 1, exclude=frozenset(map(row_operands, test_rows)), split="train")
    sft_rows = [{**row, "messages": [*row["prompt"], *tool_trace(row)]} for row in train_rows[:num_sft]]
    return {
        "train": write_parquet(train_rows, os.path.join(out_dir, "train.parquet")),
        "test": write_parquet(test_rows, os.path.join(out_dir, "test.parquet")),
        "sft": write_parquet(sft_rows, os.path.join(out_dir, "sft.parquet")),
    }
