"""A hybrid worker's rollouts in flight across steps: verl 0.9's `trainer.v1.trainer_mode=colocate_async`.

Rollout and training take turns on the same devices, as in the synchronous loop, but a step's generation does not
wait for its slowest samples: the rank generates over every prompt group it holds until its share of the step's
groups has finished, hands those to the trainer, and keeps the rest part-way. After the update and the weight sync
the next step's call carries them on under the new weights (their KV rebuilt; a sample's tokens may then come from
several weight versions, as in verl's partial rollouts) beside the prompts that step adds. The first step adds
`num_warmup_batches` batches more, so there is always more in flight than one step trains on.

How old a sample may get is verl's sampler bound, in weight versions: a group sent under version `v` (after `v`
trainer steps) and trained at step `t` spans `t - v` versions (1: fresh). With `max_off_policy_strategy=drop` a group that would span
more than `max_off_policy_threshold` is dropped before the call (its prompt is not generated again: the next
batch's prompts take its place); with `wait` the groups at the bound go first and the call runs until they have
finished, so they are trained this step.

The trainer keeps each row's other columns (rlcore.trainer.colocate_async) and finds them again by `row_id`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlcore.protocol import DataProto
from rlcore.rollout.base import Carried, RolloutEngine, RolloutOutput, SamplingParams, Until, assemble_sequences

PROMPT_COLUMNS = ("input_ids", "attention_mask")


def spans(started: torch.Tensor, step: int) -> torch.Tensor:
    """Weight versions a row would span if trained at trainer step `step` (started under version `started`)."""
    return step - started


def groups_to_drop(started: torch.Tensor, step: int, n: int, max_span: int) -> torch.Tensor:
    """Per row: whether its group can no longer be trained within the bound at step `step` (verl's drop rule:
    a group goes as a whole)."""
    return (spans(started, step) > max_span).view(-1, n).any(1).repeat_interleave(n)


@dataclass
class InFlight:
    """The rank's rows: prompts (left-padded), ids, the weights version each was sent under (its age, as verl's
    sampler counts it), first generated under and last generated under, and what they have generated (Carried)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    row_id: torch.Tensor
    started: torch.Tensor
    first: torch.Tensor
    ended: torch.Tensor
    carried: Carried

    def __len__(self) -> int:
        return len(self.row_id)

    def index(self, rows: torch.Tensor) -> "InFlight":
        c = self.carried
        return InFlight(self.input_ids[rows], self.attention_mask[rows], self.row_id[rows], self.started[rows], self.first[rows], self.ended[rows],
                        Carried(c.responses[rows], c.log_probs[rows], c.steps[rows], c.finished[rows]))

    @classmethod
    def fresh(cls, prompts: DataProto, version: int, max_tokens: int, pad_token_id: int) -> "InFlight":
        b = prompts.batch
        rows = len(b["row_id"])
        now = torch.full((rows,), version)
        return cls(b["input_ids"], b["attention_mask"], b["row_id"].long(), now, now.clone(), now.clone(),
                   Carried(torch.full((rows, max_tokens), pad_token_id, dtype=torch.long), torch.zeros(rows, max_tokens),
                           torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool)))

    @classmethod
    def concat(cls, old: "InFlight", new: "InFlight", pad_token_id: int) -> "InFlight":
        width = max(old.input_ids.shape[1], new.input_ids.shape[1])
        left = lambda t, value: F.pad(t, (width - t.shape[1], 0), value=value)  # noqa: E731 -- prompts stay left-padded
        cat = lambda a, b: torch.cat([a, b])  # noqa: E731
        a, b = old.carried, new.carried
        return cls(cat(left(old.input_ids, pad_token_id), left(new.input_ids, pad_token_id)),
                   cat(left(old.attention_mask, 0), left(new.attention_mask, 0)), cat(old.row_id, new.row_id),
                   cat(old.started, new.started), cat(old.first, new.first), cat(old.ended, new.ended),
                   Carried(cat(a.responses, b.responses), cat(a.log_probs, b.log_probs), cat(a.steps, b.steps), cat(a.finished, b.finished)))


class PartialRollouts:
    """One rank's side of colocate_async: `step` adds the prompts it is sent, generates until `groups` whole groups
    have finished, and returns those (oldest first); the others stay for the next step."""

    def __init__(self, n: int, max_span: int, strategy: str, pad_token_id: int) -> None:
        self.n, self.max_span, self.strategy, self.pad_token_id = n, max_span, strategy, pad_token_id
        self.rows: InFlight | None = None

    def step(self, engine: RolloutEngine, prompts: DataProto, sampling: SamplingParams, version: int, groups: int) -> tuple[DataProto, dict]:
        """`prompts`: the rows this step adds (input_ids, attention_mask, row_id; n adjacent rows per group);
        `version`: the weights' (trainer steps taken: the step trained next is version + 1); `groups`: how many
        whole groups to return. Returns their sequences (assemble_sequences' columns, `row_id`, `rollout_versions`:
        the versions its first and last tokens were sampled under) and the call's metrics."""
        step = version + 1
        new = InFlight.fresh(prompts, version, sampling.max_tokens, self.pad_token_id)
        rows = new if self.rows is None else InFlight.concat(self.rows, new, self.pad_token_id)
        dropped = torch.zeros(len(rows), dtype=torch.bool)
        if self.strategy == "drop":
            dropped = groups_to_drop(rows.started, step, self.n, self.max_span)
            rows = rows.index(torch.nonzero(~dropped).squeeze(-1))
        # Oldest first (the order they arrived in): with `wait` the groups at the bound are among the first and must finish.
        due = int((spans(rows.started, step) >= self.max_span).view(-1, self.n).any(1).sum()) if self.strategy == "wait" else 0
        until = Until(groups, first=min(due, groups))
        stats = {"rollout/carried_rows": int((rows.carried.steps > 0).sum() + rows.carried.finished.sum())}
        if not until.met(rows.carried.finished, self.n):
            out = engine.generate(rows.input_ids, rows.attention_mask, sampling, until=until, carried=rows.carried)
            grew, now = out.response_mask.sum(-1) > rows.carried.steps, torch.full_like(rows.ended, version)
            rows.first = torch.where(grew & (rows.carried.steps == 0), now, rows.first)
            rows.ended = torch.where(grew, now, rows.ended)
            rows.carried = Carried.of(out)
            stats.update({f"rollout/{k}": v for k, v in getattr(engine, "stats", {}).items()})
        complete = rows.carried.finished.view(-1, self.n).all(1)
        taken = torch.zeros_like(complete)
        taken[torch.nonzero(complete).squeeze(-1)[:groups]] = True
        taken = taken.repeat_interleave(self.n)
        out_rows, self.rows = rows.index(torch.nonzero(taken).squeeze(-1)), rows.index(torch.nonzero(~taken).squeeze(-1))
        stats["rollout/dropped_samples"] = int(dropped.sum())
        c = out_rows.carried
        mask = (torch.arange(c.responses.shape[1]) < c.steps[:, None]).long()
        sequences = assemble_sequences(out_rows.input_ids, out_rows.attention_mask,
                                       RolloutOutput(c.responses, c.log_probs, mask, versions=torch.stack([out_rows.first, out_rows.ended], -1)))
        return DataProto.from_dict({**sequences, "row_id": out_rows.row_id}), stats
