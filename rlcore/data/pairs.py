"""Preference pairs for reward-model training: parquet rows of `prompt` (chat messages), `chosen` and `rejected`
(the assistant's two answers) and an optional margin, tokenized once in the reward model's chat template."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rlcore.data.dataset import read_rows
from rlcore.data.rm_inputs import chat_sequences, right_aligned
from rlcore.protocol import DataProto

TRUNCATIONS = ("error", "left")  # left: keep the last max_length tokens (the score is read at the last one)


@dataclass
class PairData:
    chosen: list[list[int]]
    rejected: list[list[int]]
    margin: list[float]

    def __len__(self) -> int:
        return len(self.chosen)

    def batch(self, index: list[int], pad_token_id: int, max_length: int) -> DataProto:
        """Pairs `index` as 2 x len(index) rows, chosen and rejected interleaved (row 2i and 2i + 1), so any split
        into an even number of rows keeps every pair together."""
        sequences = [s for i in index for s in (self.chosen[i], self.rejected[i])]
        tensors = right_aligned(sequences, pad_token_id, max_length)
        tensors["pair_margin"] = torch.tensor([self.margin[i] for i in index for _ in range(2)], dtype=torch.float32)
        return DataProto.from_dict(tensors)


def read_pairs(files: list[str], tokenizer, prompt_key: str, chosen_key: str, rejected_key: str, margin_key: str | None,
               max_length: int, truncation: str) -> PairData:
    rows, origins = read_rows([os.path.abspath(os.path.expanduser(f)) for f in files])
    where = [f"{path} row {i}" for path, i in origins]
    if not rows:
        raise ValueError(f"no preference pairs in {files}")
    for key in (prompt_key, chosen_key, rejected_key) + ((margin_key,) if margin_key else ()):
        if key not in rows[0]:
            raise ValueError(f"{where[0]}: no column {key!r} (columns: {sorted(rows[0])}); set data.prompt_key / chosen_key / "
                             "rejected_key / margin_key to the columns holding the chat prompt, the two answers and the margin")
    prompts = [r[prompt_key] for r in rows]
    chosen = chat_sequences(tokenizer, prompts, [r[chosen_key] for r in rows])
    rejected = chat_sequences(tokenizer, prompts, [r[rejected_key] for r in rows])
    if truncation == "error":
        lengths = [max(len(c), len(r)) for c, r in zip(chosen, rejected)]
        too_long = [i for i, n in enumerate(lengths) if n > max_length]
        if too_long:
            i = too_long[0]
            raise ValueError(f"{where[i]}: a pair has {lengths[i]} tokens, more than data.max_length={max_length} ({len(too_long)} pairs "
                             f"are too long, the longest has {max(lengths)}); raise data.max_length or set data.truncation=left")
    margin = [float(r[margin_key]) if margin_key else 0.0 for r in rows]
    return PairData(chosen, rejected, margin)
