"""Supervised fine-tuning rows: a prompt (chat messages, or a string taken as one user turn) and the response to
learn, tokenized once into the layout RL uses (left-padded prompt, right-padded response + EOS), so the loss
sees exactly the positions the policy is later trained on.

Multi-turn rows (verl 0.9's `data.messages_key`, or 0.8's `data.multiturn.enable`): a whole conversation. The prompt is everything
before the first assistant turn, the response the rest of the conversation, and the loss covers only what the
assistant says (each assistant turn's content and its end-of-turn token, not the template's header before it,
nor the user's, system's or tools' turns), read off the chat template by rendering the conversation one message
at a time."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from rlcore.data.dataset import read_rows
from rlcore.data.multimodal import image_row_check, process_row
from rlcore.models.vision import MULTI_MODAL_INPUTS
from rlcore.protocol import DataProto, position_ids_from_mask


@dataclass(frozen=True)
class TemplateArgs:
    """What every row's chat template is rendered with: data.apply_chat_template_kwargs, and a conversation's
    enable_thinking when its row has no such column (data.enable_thinking_default; None = the template's default)."""

    kwargs: dict
    enable_thinking_default: bool | None = None


@dataclass
class SFTData:
    prompts: list[list[int]]
    responses: list[list[int]]
    loss_masks: list[list[int]] | None = None  # per response token, 1 where the loss applies (multi-turn); None = all
    media: list[dict] | None = None  # a vision-language model's rows: each one's processor tensors (multi_modal_inputs)

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, index: list[int], pad_token_id: int, max_length: int | None = None) -> DataProto:
        prompts, responses = [self.prompts[i] for i in index], [self.responses[i] for i in index]
        width_p, width_r = max(map(len, prompts)), max(map(len, responses))
        ids = [[pad_token_id] * (width_p - len(p)) + p + r + [pad_token_id] * (width_r - len(r)) for p, r in zip(prompts, responses)]
        mask = [[0] * (width_p - len(p)) + [1] * (len(p) + len(r)) + [0] * (width_r - len(r)) for p, r in zip(prompts, responses)]
        attention_mask = torch.tensor(mask)
        media = {}
        if self.media is not None:
            media[MULTI_MODAL_INPUTS] = np.empty(len(index), dtype=object)
            media[MULTI_MODAL_INPUTS][:] = [self.media[i] for i in index]
        return DataProto.from_dict({
            "input_ids": torch.tensor(ids), "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": torch.tensor([r + [pad_token_id] * (width_r - len(r)) for r in responses]),
            "response_mask": torch.tensor([self._loss_mask(i, len(r)) + [0] * (width_r - len(r)) for i, r in zip(index, responses)]),
        }, media)

    def _loss_mask(self, row: int, length: int) -> list[int]:
        return [1] * length if self.loss_masks is None else self.loss_masks[row]


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


def chat_prompt_ids(tokenizer, prompt, **template_kwargs) -> list[int]:
    """The prompt (chat messages, or a string taken as one user turn) in the chat template, ready for the answer."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **template_kwargs)
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
             prompt_dict_keys: list[str] = (), response_dict_keys: list[str] = (), multiturn=None, processor=None,
             image_key: str = "images", template: TemplateArgs = TemplateArgs({}), max_rows: int | None = None) -> SFTData:
    """`multiturn`: where conversation rows keep their messages, tools and thinking flag (rlcore.config.sft_schema.
    conversation_columns), or None for prompt/response rows. `processor`: a vision-language model's (verl's sft_vlm):
    each row's images in `image_key` (one `<image>` per image in the prompt) are expanded into their tokens, their
    tensors kept for the forward; images are never cut. `max_rows`: the first rows only (data.*_max_samples)."""
    prompts, responses, media = [], [], []
    rows, origins = read_rows([os.path.abspath(os.path.expanduser(f)) for f in files])
    rows, origins = rows[:max_rows], origins[:max_rows]
    if multiturn is not None and multiturn.enable:
        return _read_conversations(rows, origins, tokenizer, multiturn, max_length, truncation, files, template)
    for row, (path, i) in zip(rows, origins):
        where = f"{path} row {i}"
        if prompt_key not in row or response_key not in row:
            raise ValueError(f"{where}: no column {prompt_key if prompt_key not in row else response_key!r} (columns: {sorted(row)}); "
                             "set data.prompt_key / data.response_key")
        messages = _dig(row[prompt_key], list(prompt_dict_keys), prompt_key, where)
        if processor is not None:
            messages = messages if isinstance(messages, list) else [{"role": "user", "content": str(messages)}]
            problem = image_row_check(prompt_key, image_key)({prompt_key: messages, image_key: row.get(image_key)})
            if problem:
                raise ValueError(f"{where}: {problem}")
            prompt, inputs, _ = process_row(processor, messages, row.get(image_key) or [])
            media.append(inputs)
        else:
            prompt = chat_prompt_ids(tokenizer, messages, **template.kwargs)
        answer = _dig(row[response_key], list(response_dict_keys), response_key, where)
        response = tokenizer.encode(str(answer), add_special_tokens=False) + [tokenizer.eos_token_id]
        prompt, response = _truncate(prompt, response, max_length, "error" if media and media[-1] else truncation, where)
        prompts.append(prompt)
        responses.append(response)
    if not prompts:
        raise ValueError(f"no SFT rows in {files}")
    return SFTData(prompts, responses, media=media if processor is not None else None)


def _read_conversations(rows, origins, tokenizer, multiturn, max_length: int, truncation: str, files,
                        template: TemplateArgs) -> SFTData:
    prompts, responses, masks = [], [], []
    for row, (path, i) in zip(rows, origins):
        where = f"{path} row {i}"
        if multiturn.messages_key not in row:
            raise ValueError(f"{where}: no column {multiturn.messages_key!r} (columns: {sorted(row)}); set data.messages_key "
                             "(verl 0.9) or data.multiturn.messages_key (verl 0.8)")
        kwargs = dict(template.kwargs)
        if multiturn.tools_key in row and row[multiturn.tools_key] is not None:
            kwargs["tools"] = list(row[multiturn.tools_key])
        if multiturn.enable_thinking_key in row and row[multiturn.enable_thinking_key] is not None:
            kwargs["enable_thinking"] = bool(row[multiturn.enable_thinking_key])
        elif template.enable_thinking_default is not None:
            kwargs["enable_thinking"] = template.enable_thinking_default
        prompt, response, mask = conversation_ids(tokenizer, list(row[multiturn.messages_key]), where, **kwargs)
        prompt, cut = _truncate(prompt, response, max_length, truncation, where)
        prompts.append(prompt)
        responses.append(cut)
        masks.append(mask[: len(cut)])
    if not prompts:
        raise ValueError(f"no SFT rows in {files}")
    return SFTData(prompts, responses, masks)


def conversation_ids(tokenizer, messages: list[dict], where: str, **template_kwargs) -> tuple[list[int], list[int], list[int]]:
    """(prompt, response, loss mask over the response) of one conversation. Message k's tokens are what rendering
    messages[:k+1] adds to rendering messages[:k]; an assistant turn's loss starts after the header the template
    writes for it (the generation prompt) and ends with its end-of-turn token."""
    def render(upto: int, generation_prompt: bool) -> list[int]:
        if upto == 0 and not generation_prompt:
            return []
        ids = tokenizer.apply_chat_template(messages[:upto], add_generation_prompt=generation_prompt, tokenize=True, **template_kwargs)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise ValueError(f"{where}: the conversation has no assistant turn to learn (roles: {roles})")
    first = roles.index("assistant")
    full = render(len(messages), False)
    prompt = render(first, True)
    mask = [0] * len(full)
    for k in range(first, len(messages)):
        before, after = render(k, roles[k] == "assistant"), render(k + 1, False)
        if full[: len(after)] != after or after[: len(before)] != before:
            raise ValueError(f"{where}: the chat template renders message {k} differently once later messages follow (it "
                             "rewrites earlier turns, e.g. dropping reasoning from past assistant turns), so the assistant's "
                             "tokens cannot be told apart; use a template that only appends (or data.multiturn.enable=false)")
        if roles[k] == "assistant":
            mask[len(before): len(after)] = [1] * (len(after) - len(before))
    return prompt, full[len(prompt):], mask[len(prompt):]
