"""Supervised fine-tuning rows: a prompt (chat messages, or a string taken as one user turn) and the response to
learn, tokenized once into the layout RL uses (left-padded prompt, right-padded response + EOS), so the loss
sees exactly the positions the policy is later trained on."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rlcore.data.dataset import read_rows
from rlcore.protocol import DataProto, position_ids_from_mask



@dataclass
class SFTData:
    prompts: list[list[int]]
    responses: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, index: list[int], pad_token_id: int, max_length: int | None = None) -> DataProto:
        prompts, responses = [self.prompts[i] for i in index], [self.responses[i] for i in index]
        width_p, width_r = max(map(len, prompts)), max(map(len, responses))
        ids = [[pad_token_id] * (width_p - len(p)) + p + r + [pad_token_id] * (width_r - len(r)) for p, r in zip(prompts, responses)]
        mask = [[0] * (width_p - len(p)) + [1] * (len(p) + len(r)) + [0] * (width_r - len(r)) for p, r in zip(prompts, responses)]
        attention_mask = torch.tensor(mask)
        return DataProto.from_dict({
            "input_ids": torch.tensor(ids), "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": torch.tensor([r + [pad_token_id] * (width_r - len(r)) for r in responses]),
            "response_mask": torch.tensor([[1] * len(r) + [0] * (width_r - len(r)) for r in responses]),
        })


def _truncate(prompt: list[int], response: list[int], max_length: int, truncation: str, where: str) -> tuple[list[int], list[int]]:
    excess = len(prompt) + len(response) - max_length
    if excess <= 0:
        return prompt, response
    if truncation == "left" and excess < len(prompt):
        return prompt[excess:], response
    if truncation == "right" and excess < len(response):
        return prompt, response[: len(response) - excess]
    raise ValueError(f"{where}: prompt {len(prompt)} + response {len(response)} tokens is more than data.max_length={max_length}"
                     + ("" if truncation == "error" else f", and data.truncation={truncation} cannot cut that much")
                     + "; raise data.max_length or set data.truncation=left (drop the prompt's start) or right (the response's end)")


def chat_prompt_ids(tokenizer, prompt) -> list[int]:
    """The prompt (chat messages, or a string taken as one user turn) in the chat template, ready for the answer."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _dig(value, keys: list[str], column: str, where: str):
    """verl's `*_dict_keys`: the column holds a dict (e.g. extra_info) and the text is value[k1][k2]..."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            found = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{where}: column {column!r} has no key {key!r} (it has {found}); check data.prompt_dict_keys / "
                             "data.response_dict_keys")
        value = value[key]
    return value


def read_sft(files: list[str], tokenizer, prompt_key: str, response_key: str, max_length: int, truncation: str,
             prompt_dict_keys: list[str] = (), response_dict_keys: list[str] = ()) -> SFTData:
    prompts, responses = [], []
    rows, origins = read_rows([os.path.abspath(os.path.expanduser(f)) for f in files])
    for row, (path, i) in zip(rows, origins):
        where = f"{path} row {i}"
        if prompt_key not in row or response_key not in row:
            raise ValueError(f"{where}: no column {prompt_key if prompt_key not in row else response_key!r} (columns: {sorted(row)}); "
                             "set data.prompt_key / data.response_key")
        prompt = chat_prompt_ids(tokenizer, _dig(row[prompt_key], list(prompt_dict_keys), prompt_key, where))
        answer = _dig(row[response_key], list(response_dict_keys), response_key, where)
        response = tokenizer.encode(str(answer), add_special_tokens=False) + [tokenizer.eos_token_id]
        prompt, response = _truncate(prompt, response, max_length, truncation, where)
        prompts.append(prompt)
        responses.append(response)
    if not prompts:
        raise ValueError(f"no SFT rows in {files}")
    return SFTData(prompts, responses)
