"""The prefix grouper (verl's `actor.use_prefix_grouper`): a GRPO group's n samples share their prompt, so each
micro-batch's rows with the same prompt are packed as ONE prompt followed by each row's response, and every response
attends to that one copy of the prompt and to itself. The prompt's forward (and backward) then runs once per group
instead of n times; log-probs and gradients are those of the rows packed one by one.

A packed row holds groups one after another: `[prompt_a, response_a1, ..., response_an, prompt_b, ...]`. Attention
inside a group: a prompt token sees the prompt tokens before it; a response token sees the whole prompt and its own
response's tokens before it, never another response. Positions continue from the prompt in each response, as in the
row it came from. It rides on the packed path (rlcore.models.varlen): the same `rlcore_varlen` attention, which
finds the groups in its kwargs (PREFIX_KWARG) and lets them attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlcore.models.varlen import PREFIX_KWARG, PackedBatch


@dataclass
class PrefixGroups:
    """Where each group sits in the packed row, and which of its tokens belong to which response."""

    bounds: torch.Tensor   # [num_groups + 1] token offsets of the groups in the packed row
    segment: torch.Tensor  # [total_tokens] 0 for a prompt token, i for the i-th response of its group

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None,
               dropout: float = 0.0) -> torch.Tensor:
        """The packed attention (rlcore.models.varlen.segment_attention) hands a grouped row to its groups."""
        return prefix_grouped_attention(query, key, value, self, scale, dropout)


def pack_prefix_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       response_len: int) -> tuple[PackedBatch, int]:
    """Packs a padded `[batch, seq]` micro-batch (left-padded prompts, right-padded responses) with each distinct
    prompt once; returns the batch (attention kwargs carry the groups) and how many prompt tokens it did not repeat.
    Rows are grouped by their prompt's tokens, so no uid is needed and rows of one uid split over two micro-batches
    simply form two groups."""
    width = input_ids.shape[-1]
    prompt_width = width - response_len
    mask = attention_mask.bool()
    prompts = input_ids[:, :prompt_width] * mask[:, :prompt_width]  # pad positions zeroed: equal prompts compare equal
    _, group_of = torch.unique(torch.cat([prompts, mask[:, :prompt_width].long()], -1), dim=0, return_inverse=True)
    ids, positions, segments, index, bounds = [], [], [], torch.zeros(mask.shape[0], response_len, dtype=torch.long), [0]
    saved = 0
    for group in range(int(group_of.max()) + 1 if len(group_of) else 0):
        rows = (group_of == group).nonzero().squeeze(1).tolist()
        first = rows[0]
        prompt_cols = mask[first, :prompt_width]
        start = bounds[-1]
        ids.append(input_ids[first, :prompt_width][prompt_cols])
        positions.append(position_ids[first, :prompt_width][prompt_cols])
        segments.append(torch.zeros(int(prompt_cols.sum()), dtype=torch.long))
        offset = start + int(prompt_cols.sum())
        last_prompt = offset - 1
        saved += int(prompt_cols.sum()) * (len(rows) - 1)
        for i, row in enumerate(rows, start=1):
            cols = mask[row, prompt_width:]
            count = int(cols.sum())
            ids.append(input_ids[row, prompt_width:][cols])
            positions.append(position_ids[row, prompt_width:][cols])
            segments.append(torch.full((count,), i, dtype=torch.long))
            # The state before response token j: the prompt's last token for j = 0, else the row's token j - 1
            index[row, :count] = torch.cat([torch.tensor([last_prompt]), offset + torch.arange(count - 1)])[:count]
            offset += count
        bounds.append(offset)
    valid = mask[:, prompt_width:]
    groups = PrefixGroups(bounds=torch.tensor(bounds, device=input_ids.device), segment=torch.cat(segments).to(input_ids.device))
    packed = PackedBatch(input_ids=torch.cat(ids)[None], position_ids=torch.cat(positions)[None], attention_kwargs={PREFIX_KWARG: groups},
                         response_index=index.to(input_ids.device)[valid], response_valid=valid)
    return packed, saved


def prefix_grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: PrefixGroups,
                             scale: float | None = None, dropout: float = 0.0) -> torch.Tensor:
    """query `[heads, total, dim]`, key/value `[kv_heads, total, dim]` -> `[total, heads, dim]`: one SDPA call per
    group under the module's mask (a group holds one prompt and its n responses: a Python loop over groups, never
    over tokens)."""
    out = query.new_empty(query.shape[1], query.shape[0], query.shape[2])
    gqa = query.shape[0] != key.shape[0]
    bounds = groups.bounds.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        segment = groups.segment[start:end]
        causal = torch.ones(end - start, end - start, dtype=torch.bool, device=query.device).tril()
        allowed = causal & ((segment[:, None] == segment[None, :]) | (segment[None, :] == 0))
        q, k, v = (t[None, :, start:end] for t in (query, key, value))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, dropout_p=dropout, enable_gqa=gqa)
        out[start:end] = o[0].transpose(0, 1)
    return out
