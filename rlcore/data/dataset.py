"""RLHFDataset: verl-format parquet rows -> left-padded prompt ids ready for rollout.

Each row's `prompt` column holds chat messages; the tokenizer's chat template (with the generation prompt)
turns them into text, which is tokenized once up front so overlong prompts are found before training starts.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import PreTrainedTokenizerBase

from rlcore.config.files import file_list
from rlcore.data.multimodal import image_row_check, process_row
from rlcore.data.row_checks import RowCheck, bad_rows_report, find_bad_rows, prompt_problem
from rlcore.protocol import position_ids_from_mask

TruncationMode = Literal["error", "left", "right", "middle"]
TRUNCATION_MODES = ("error", "left", "right", "middle")


def truncate_ids(ids: list[int], max_length: int, mode: TruncationMode) -> list[int]:
    """Cuts ids to max_length: "left" keeps the last tokens, "right" the first, "middle" the head and tail."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + ids[-tail:]  # tail >= 1, so ids[-tail:] never means "everything"
    raise ValueError(f"cannot truncate with mode {mode!r}; use one of {TRUNCATION_MODES[1:]}")


class RLHFDataset(torch.utils.data.Dataset):
    """Prompts from parquet file(s); item i is one prompt left-padded to max_prompt_length.

    Args:
        data_files: parquet path or list of paths (`~` is expanded); rows are concatenated in order.
        tokenizer: must define pad_token_id and a chat template.
        prompt_key: column holding the chat messages.
        max_prompt_length: length L every prompt is padded to.
        filter_overlong_prompts: drop prompts longer than L instead of applying `truncation`.
        truncation: what to do with prompts longer than L when not filtered.
        max_samples: keep only the first max_samples rows (before filtering); -1 keeps all.
        return_raw_chat: also return the messages as `raw_prompt`.
        return_full_prompt: also return the templated prompt text (before truncation) as `full_prompts` (verl's name).
        chat_template_kwargs: extra arguments of every apply_chat_template (data.apply_chat_template_kwargs, e.g.
            Qwen3's enable_thinking=False); the template sees them as variables.
        row_checks: extra checks of each row (rlcore.data.row_checks); the prompt's shape is always checked.
        skip_bad_rows: drop rows a check rejects (counted on stdout) instead of refusing the whole dataset.
        tools: OpenAI function schemas the chat template renders into each prompt (multi-turn rollouts with tools).
        processor: a vision-language model's processor: rows take images from `image_key` (rlcore.data.multimodal;
            rows with videos in `video_key` are refused) and each item carries `multi_modal_inputs` (the processor's
            tensors) and `multi_modal_data` (the images).
    """

    def __init__(
        self,
        data_files: str | list[str],
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_key: str,
        max_prompt_length: int,
        filter_overlong_prompts: bool,
        truncation: TruncationMode,
        max_samples: int,
        return_raw_chat: bool,
        row_checks: list[RowCheck] = (),
        skip_bad_rows: bool = False,
        tools: list[dict] | None = None,
        return_full_prompt: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        processor=None,
        image_key: str = "images",
        video_key: str = "videos",
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r} is not one of {TRUNCATION_MODES}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be positive, got {max_prompt_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before building the dataset")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.tools = tools
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        reserved = sorted({"conversation", "add_generation_prompt", "tokenize", "tools"} & set(self.chat_template_kwargs))
        if reserved:
            raise ValueError(f"data.apply_chat_template_kwargs sets {reserved}, which the dataset sets itself; remove them "
                             "(data.tool_config_path supplies the tools)")

        files = file_list(data_files)
        files = [os.path.expanduser(f) for f in files]
        rows, origins = read_rows(files)
        if max_samples > 0:
            rows, origins = rows[:max_samples], origins[:max_samples]
        if processor is not None:
            row_checks = [*row_checks, image_row_check(prompt_key, image_key, video_key)]
        bad = find_bad_rows(rows, [lambda row: prompt_problem(row, prompt_key), *row_checks])
        if bad:
            report = bad_rows_report(bad, origins, len(rows))
            if not skip_bad_rows:
                raise ValueError(f"{report}\nFix the data, or set data.skip_bad_rows=True to train without these rows")
            print(f"RLHFDataset: dropped {report} (data.skip_bad_rows=True)", flush=True)
            rows, origins = [r for i, r in enumerate(rows) if i not in bad], [o for i, o in enumerate(origins) if i not in bad]

        if processor is None:
            texts = [self._render(row) for row in rows]
            # Batch tokenization; the chat template already contains every special token we want.
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
            media = [None] * len(rows)
        else:  # one row at a time: the processor expands each image into as many tokens as its size gives
            processed = [process_row(processor, row[prompt_key], row.get(image_key) or [], **self.chat_template_kwargs) for row in rows]
            ids, media = [p[0] for p in processed], [(p[1], p[2]) for p in processed]
            texts = [tokenizer.decode(x) for x in ids]

        too_long = [i for i, x in enumerate(ids) if len(x) > max_prompt_length]
        if too_long and filter_overlong_prompts:
            keep = set(range(len(rows))) - set(too_long)
            print(
                f"RLHFDataset: dropped {len(too_long)} of {len(rows)} prompts longer than "
                f"data.max_prompt_length={max_prompt_length} (data.filter_overlong_prompts=True)"
            )
            rows = [r for i, r in enumerate(rows) if i in keep]
            ids = [x for i, x in enumerate(ids) if i in keep]
            texts = [x for i, x in enumerate(texts) if i in keep]
            media = [x for i, x in enumerate(media) if i in keep]
            origins = [o for i, o in enumerate(origins) if i in keep]
        elif too_long and processor is not None:
            raise ValueError(f"{len(too_long)} prompts with images are longer than data.max_prompt_length={max_prompt_length} "
                             f"(the longest has {max(len(ids[j]) for j in too_long)} tokens, image tokens included): truncating "
                             "would cut an image's tokens apart from its pixels; raise data.max_prompt_length or set "
                             "data.filter_overlong_prompts=True")
        elif too_long and truncation == "error":
            i = too_long[0]
            longest = max(len(ids[j]) for j in too_long)
            raise ValueError(
                f"prompt at row {i} ({origins[i][0]} row {origins[i][1]}) has {len(ids[i])} tokens, more than "
                f"data.max_prompt_length={max_prompt_length} ({len(too_long)} prompts are too long, the longest "
                f"has {longest}). Set data.max_prompt_length >= {longest}, or data.filter_overlong_prompts=True, "
                f"or data.truncation=left|right|middle"
            )
        self.rows = rows
        self.prompt_ids = [truncate_ids(x, max_prompt_length, truncation) for x in ids]
        self.row_positions = [pos for _, pos in origins]
        self.full_prompts = texts if return_full_prompt else None
        self.media = media  # per row: (multi_modal_inputs, images), or None for a text-only dataset

    def _render(self, row: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(row[self.prompt_key], add_generation_prompt=True, tokenize=False, tools=self.tools,
                                                  **self.chat_template_kwargs)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """input_ids / attention_mask / position_ids: LongTensor[L], plus the row's non-tensor fields."""
        ids = self.prompt_ids[i]
        num_pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.tokenizer.pad_token_id] * num_pad + ids, dtype=torch.long)
        attention_mask = torch.cat([torch.zeros(num_pad, dtype=torch.long), torch.ones(len(ids), dtype=torch.long)])
        position_ids = position_ids_from_mask(attention_mask)
        row = self.rows[i]
        extra_info = row.get("extra_info") or {}
        item: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "data_source": row.get("data_source"),
            "reward_model": row.get("reward_model") or {},
            "extra_info": extra_info,
            # verl's convention: the row's own index if it has one, else its position in its file.
            "index": int(self.row_positions[i] if extra_info.get("index") is None else extra_info["index"]),
        }
        if self.return_raw_chat:
            item["raw_prompt"] = row[self.prompt_key]
        if "agent_name" in row:  # verl's per-row agent loop (rlcore.rollout.agent_runner)
            item["agent_name"] = row["agent_name"]
        if self.full_prompts is not None:
            item["full_prompts"] = self.full_prompts[i]
        if self.media[i] is not None:
            item["multi_modal_inputs"], images = self.media[i]
            item["multi_modal_data"] = {"image": images}
        return item


def collate_fn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stacks tensors into [B, L]; every other field becomes a numpy object array of length B."""
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            # np.array(values) would turn a list of message lists into a 2-D array; fill an empty one instead.
            column = np.empty(len(values), dtype=object)
            for j, value in enumerate(values):
                column[j] = value
            out[key] = column
    return out


def read_rows(files: list[str]) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """All rows of the parquet `files` as plain Python dicts/lists, plus (file, row-in-file) for error messages."""
    rows: list[dict[str, Any]] = []
    origins: list[tuple[str, int]] = []
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data file {path} does not exist (check data.train_files / data.val_files)")
        # to_pylist, not pandas: pandas turns list<struct> into numpy arrays of dicts.
        table: pa.Table = pq.read_table(path)
        file_rows = table.to_pylist()
        rows.extend(file_rows)
        origins.extend((path, i) for i in range(len(file_rows)))
    return rows, origins
