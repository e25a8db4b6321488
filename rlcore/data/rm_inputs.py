"""What a reward model reads: each sample as one left-padded sequence whose last token is where the score is read.

A sequence-classification reward model (HF `*ForSequenceClassification`, num_labels=1) scores a conversation by
its head's output at the last token. rlcore's engines compute per-token outputs for a "response" at the right
end of each row, so a reward model's batch is laid out with every row's valid tokens flush right and a
one-token "response" (the last token): the score comes back as `[batch, 1]`.
"""

from __future__ import annotations

import torch

from rlcore.protocol import position_ids_from_mask


def right_aligned(sequences: list[list[int]], pad_token_id: int, max_length: int | None = None) -> dict[str, torch.Tensor]:
    """Left-padded `[rows, width]` tensors of token lists; a sequence longer than `max_length` keeps its last
    `max_length` tokens (the response and the end of the prompt: what a reward model must see)."""
    if max_length is not None:
        sequences = [s[-max_length:] for s in sequences]
    if any(not s for s in sequences):
        raise ValueError("a reward-model input is empty (no prompt and no response tokens)")
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        input_ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        attention_mask[i, width - len(s):] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": input_ids[:, -1:].clone(), "response_mask": torch.ones(len(sequences), 1, dtype=torch.long)}


def policy_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The valid tokens of each row of the training layout (left-padded prompt, right-padded response)."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


def chat_sequences(tokenizer, prompts: list[list[dict]], responses: list[str]) -> list[list[int]]:
    """Each conversation (prompt messages + the response as the assistant's turn) in the reward model's own chat
    template: what it was trained on when its tokenizer differs from the policy's."""
    conversations = [[*messages, {"role": "assistant", "content": response}] for messages, response in zip(prompts, responses)]
    if not conversations:  # HF would read an empty batch as one empty conversation
        return []
    # What apply_chat_template(tokenize=True) does, rendered and encoded as one batch each: a third of the time of
    # one call per conversation (the reward-model demo's mining scores 200k of them).
    texts = tokenizer.apply_chat_template(conversations, tokenize=False)
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def same_tokenization(a, b) -> bool:
    """True when two tokenizers turn a conversation into the same ids (same vocabulary and chat template)."""
    return a.get_vocab() == b.get_vocab() and a.chat_template == b.chat_template


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """`[batch]` sequence scores placed on each response's last valid token: `[batch, response_len]` (verl's layout
    for rm_scores; an empty response has no token and scores nothing)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.sum(-1).long()
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    out[rows, lengths[rows] - 1] = scores.reshape(-1)[rows].float()
    return out
