"""The native rollout's bookkeeping for one generate() call (rlcore.rollout.native), by responsibility:

    Requests       the call's rows: their prompts, what they have produced so far, the KV kept for them
    Scheduler      which prompt groups join the running batch now (free slots, the prefill's token budget)
    RunningBatch   the decoding slots: which row each runs, its tokens so far, its next KV position; rows join
                   (add), finished ones leave and the last slots move into their holes (select)

The model steps (prefill, decode, the rebuild after new weights) stay with the engine, which owns the model and
the KV pool; its loop reads: admit, sample, record, retire the finished, decode, and park when weights change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from rlcore.rollout.base import Carried, RolloutOutput


@dataclass
class Requests:
    """The call's request rows: prompts `[batch, prompt_len]`, n samples per prompt group, and per row the
    response tokens, their log-probs and which are real. Column `max_tokens` is a spare: a row that finished since
    the last check writes there until it leaves the running batch, and the spare is dropped at the end."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    n: int
    max_tokens: int
    responses: torch.Tensor
    log_probs: torch.Tensor
    alive: torch.Tensor
    versions: torch.Tensor | None  # [batch, 2]: the weights version each row started and ended under (split pools)
    reuse: list | None  # per row: the KV kept for it by the previous call (multi-turn), or None
    finished: torch.Tensor  # [batch] bool: the row has finished (set as rows retire)
    carried: torch.Tensor | None  # [batch] tokens each row brought from an earlier call (Carried), or None

    @classmethod
    def of(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, max_tokens: int, pad_token_id: int,
           version: int | None, reuse: list | None, carried: Carried | None = None) -> "Requests":
        batch, device = len(input_ids), input_ids.device
        requests = cls(input_ids, attention_mask, n, max_tokens,
                       responses=torch.full((batch, max_tokens + 1), pad_token_id, dtype=torch.long, device=device),
                       log_probs=torch.zeros(batch, max_tokens + 1, device=device),
                       alive=torch.zeros(batch, max_tokens + 1, dtype=torch.bool, device=device),
                       versions=None if version is None else torch.full((batch, 2), version, dtype=torch.long, device=device),
                       reuse=reuse, finished=torch.zeros(batch, dtype=torch.bool, device=device), carried=None)
        if carried is not None:
            width = carried.responses.shape[1]
            if width > max_tokens:
                raise ValueError(f"native rollout: carried rows hold {width} response columns, more than max_tokens={max_tokens}")
            requests.responses[:, :width] = carried.responses.to(device)
            requests.log_probs[:, :width] = carried.log_probs.to(device).float()
            requests.carried = carried.steps.to(device).long()
            requests.alive[:, :max_tokens] = torch.arange(max_tokens, device=device) < requests.carried[:, None]
            requests.finished |= carried.finished.to(device).bool()
        return requests

    def resumed(self, first_row: int) -> bool:
        """Whether the group starting at `first_row` comes back part-way (its KV is rebuilt rather than prefilled)."""
        group = slice(first_row, first_row + self.n)
        return self.carried is not None and bool((self.carried[group] > 0).any() or self.finished[group].any())

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1]

    def record(self, rows: torch.Tensor, columns: torch.Tensor, token: torch.Tensor, log_prob: torch.Tensor) -> None:
        self.responses[rows, columns], self.log_probs[rows, columns], self.alive[rows, columns] = token, log_prob.float(), True

    def output(self, routes: torch.Tensor | None) -> RolloutOutput:
        cut = self.max_tokens
        return RolloutOutput(responses=self.responses[:, :cut].cpu(), response_log_probs=self.log_probs[:, :cut].cpu(),
                             response_mask=self.alive[:, :cut].long().cpu(), versions=None if self.versions is None else self.versions.cpu(),
                             routed_experts=None if routes is None else routes[:, : self.prompt_len + cut], finished=self.finished.cpu())


class Scheduler:
    """Prompt groups waiting for slots, first come first served. A group joins when all its n samples have a free
    slot and the prefill stays within `max_batched_tokens` (the first group is always taken when nothing runs, or
    no budget could ever admit it)."""

    def __init__(self, batch: int, n: int, prompt_len: int, max_batched_tokens: int, finished: torch.Tensor | None = None) -> None:
        # the first row of each waiting group; a group carried in finished (`finished`, per row) never waits
        done = finished.view(-1, n).all(1).tolist() if finished is not None else [False] * (batch // n)
        self.waiting = deque(first for first, over in zip(range(0, batch, n), done) if not over)
        self.n, self.prompt_len, self.max_batched_tokens = n, prompt_len, max_batched_tokens

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def admit(self, running: int, num_slots: int) -> list[int]:
        admitted: list[int] = []
        while self.waiting and running + (len(admitted) + 1) * self.n <= num_slots:
            if admitted and (len(admitted) + 1) * self.prompt_len > self.max_batched_tokens:
                break
            admitted.append(self.waiting.popleft())
        return admitted


@dataclass
class RunningBatch:
    """The decoding slots `[0, len)`: slot i runs request row `req[i]`, has sampled `steps[i]` tokens (the last
    `token[i]`), writes its next KV at `pos[i]`; `done[i]`: finished but not yet compacted away. `logits`: each
    slot's next-token logits. `max_pos`: a host-side upper bound of pos.max(), exact after each retire(): how many
    key positions a decode step reads, known without asking the device."""

    req: torch.Tensor
    steps: torch.Tensor
    pos: torch.Tensor
    done: torch.Tensor
    token: torch.Tensor
    logits: torch.Tensor
    max_pos: int = 0

    @classmethod
    def empty(cls, vocab: int, device: torch.device) -> "RunningBatch":
        none = torch.zeros(0, dtype=torch.long, device=device)
        return cls(none, none, none, torch.zeros(0, dtype=torch.bool, device=device), none, torch.zeros(0, vocab, device=device))

    def __len__(self) -> int:
        return len(self.req)

    def add(self, rows: torch.Tensor, pos: torch.Tensor, logits: torch.Tensor, prompt_len: int, steps: torch.Tensor | None = None) -> None:
        """Rows that were just prefilled (or rebuilt with `steps` tokens each, carried), writing their next KV at `pos`."""
        self.req, self.steps = torch.cat([self.req, rows]), torch.cat([self.steps, torch.zeros_like(rows) if steps is None else steps])
        self.pos, self.logits = torch.cat([self.pos, pos]), torch.cat([self.logits, logits])
        self.done = torch.cat([self.done, torch.zeros_like(rows, dtype=torch.bool)])
        self.max_pos = max(self.max_pos, prompt_len)  # a prefill's next position is <= prompt_len (no read-back)

    def sampled(self, token: torch.Tensor, stop_ids: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """Takes each slot's sampled token; returns the response column it goes to (a finished slot's: the spare)."""
        column = self.steps.masked_fill(self.done, max_tokens)
        self.token = token
        self.steps = self.steps + (~self.done).long()
        self.done = self.done | torch.isin(token, stop_ids) | (self.steps == max_tokens)
        return column

    def select(self, keep: torch.Tensor) -> None:
        """Keeps slot `keep[i]` as slot i (the order the KV pool's compaction left the slots in)."""
        self.req, self.steps, self.pos, self.token, self.done = (t[keep] for t in (self.req, self.steps, self.pos, self.token, self.done))

    def advance(self, max_len: int) -> None:
        """After a decode step: every slot's next position (only a finished row's extra steps reach the slot's end)."""
        self.pos, self.max_pos = (self.pos + 1).clamp_(max=max_len - 1), min(self.max_pos + 1, max_len - 1)
