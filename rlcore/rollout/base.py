"""The rollout-engine seam. Native (embedded) and vLLM engines both implement `RolloutEngine`.

Prompts cross the seam as left-padded token-id tensors; responses come back right-padded with their log-probs.
The vLLM adapter strips the padding into token-id lists (vLLM's `TokensPrompt`) and pads the outputs back.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol

import torch

from rlcore.protocol import position_ids_from_mask

if TYPE_CHECKING:
    from rlcore.models.lora import Adapters


WEIGHT_BUCKET_BYTES = 2048 * 2**20  # verl: rollout.checkpoint_engine.update_weights_bucket_megabytes=2048


class WeightSource(Protocol):
    """What the hybrid engine reads the training weights from (every TrainEngine is one): full tensors under HF
    names, gathered `bucket_bytes` at a time; `transient`: a tensor may be overwritten once the next is yielded;
    `adapted_only`: with LoRA, only the weights the adapters change (merged); `unmerged`: the frozen base alone,
    the adapters then coming as `rollout_adapters()` (LoRA without merging); `trainable_only`: the parameters that
    take gradients (a frozen vision tower left out)."""

    def rollout_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES, transient: bool = False, adapted_only: bool = False,
                        unmerged: bool = False, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]: ...

    def rollout_adapters(self) -> Adapters: ...


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                     # -1 or 0: off (verl / vLLM convention)
    do_sample: bool = True              # False: greedy
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    adapter: str | None = None          # LoRA without merging: the held adapter to generate with (None: the policy's)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0.0


@dataclass
class RolloutOutput:
    responses: torch.Tensor             # [batch, max_tokens] token ids, pad after the stop token
    response_log_probs: torch.Tensor    # [batch, max_tokens] log-prob of each sampled token (0 on padding)
    response_mask: torch.Tensor         # [batch, max_tokens] 1 for generated tokens, stop token included
    # [batch, max_tokens] 1 on the tokens the policy sampled, when not all response tokens were: a multi-turn
    # trajectory's tool responses are context (response_mask 1, attended to) but not trained on (loss_mask 0).
    loss_mask: torch.Tensor | None = None
    # [batch, 2] the weights versions (WeightGate.version) each row's generation started and ended under, where the
    # engine's weights are versioned (split pools); end > start: the row was resumed under newer weights.
    versions: torch.Tensor | None = None
    # [batch, prompt_len + max_tokens, layers, top_k] int16: a mixture of experts' routes for every input token (the
    # prompt's, then each sampled token's as it was fed back), when the engine records them (R3 router replay).
    routed_experts: torch.Tensor | None = None
    # [batch] bool, from a call with `until` (Until): which rows finished; the others stopped part-way, their tokens
    # so far in responses / response_log_probs / response_mask, to go on in a later call (Carried).
    finished: torch.Tensor | None = None


@dataclass
class Until:
    """Ends a generate() call once `groups` whole prompt groups (all n samples) have finished, the first `first`
    groups of the batch among them, leaving the other rows part-way (verl 0.9's colocate_async: a step trains on
    the groups that finish first, and the rest go on after the weight sync, under the new weights)."""

    groups: int
    first: int = 0

    def met(self, finished: torch.Tensor, n: int) -> bool:
        """Whether rows `finished` (per row, n adjacent rows a group) complete it."""
        done = finished.view(-1, n).all(1)
        return int(done.sum()) >= self.groups and bool(done[: self.first].all())


@dataclass
class Carried:
    """Rows an earlier call left part-way (RolloutOutput.finished False) or finished without training them, handed
    to the next call with their prompts: per row the response tokens so far `[batch, max_tokens]`, their log-probs,
    how many there are, and whether the row is finished (it is then passed through, not generated further). A row
    with no tokens and not finished is a prompt that never started. The engine recomputes the rows' KV under its
    current weights (a partial rollout: a row's tokens may come from several weight versions)."""

    responses: torch.Tensor
    log_probs: torch.Tensor
    steps: torch.Tensor
    finished: torch.Tensor

    @classmethod
    def of(cls, out: RolloutOutput) -> "Carried":
        return cls(out.responses, out.response_log_probs, out.response_mask.sum(-1), out.finished)


class WeightGate:
    """Between the threads of a rollout worker on split pools: one generates, the other loads the trainer's weights
    (rlcore.workers.rollout). `updating()` waits until no generate() call is computing: an engine that can resume
    (`RolloutEngine.resumes_generation`, the native one) parks its calls at the next decode step (`park()`) and
    rebuilds their KV under the new weights after the update (a partial rollout); any other finishes its call first.
    Engines take `generating()` around each call. `version` counts the loads, as the trainer numbers them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending = False  # an update waits or runs
        self.active = 0       # generate() calls computing (not parked)
        self.version: int | None = None  # None: never loaded through the gate (the hybrid engine)

    @contextmanager
    def generating(self) -> Iterator[None]:
        with self.cond:
            self.cond.wait_for(lambda: not self.pending)
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    def park(self) -> bool:
        """At a step boundary of a generate() call: if an update waits, lets it run and returns True once it is done
        (the call must then rebuild its KV); else False at the cost of reading one attribute."""
        if not self.pending:
            return False
        with self.cond:
            self.active -= 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.pending)
            self.active += 1
        return True

    @contextmanager
    def updating(self, version: int) -> Iterator[None]:
        """Exclusive use of the weights; on success they become `version`."""
        with self.cond:
            self.cond.wait_for(lambda: not self.pending)
            self.pending = True
            self.cond.wait_for(lambda: self.active == 0)
        try:
            yield
            self.version = version  # before the parked calls wake: their rows' versions read it
        finally:
            with self.cond:
                self.pending = False
                self.cond.notify_all()


class RolloutEngine(ABC):
    # Whether weights loaded by update_weights stay loaded across sleep(): then a LoRA run sends only the weights its
    # adapters change. vLLM's sleep(level=2) discards them, so every sync there reloads every weight.
    keeps_weights: bool = True
    # Whether a sync may leave out whole modules whose weights have not changed since the last one (a frozen vision
    # tower): the engine keeps what it was sent across sleep(level=1), and a stream of whole modules is no partial layer.
    keeps_unsent_modules: bool = True
    # Whether generate() takes keep_kv / prefix_of: a multi-turn trajectory's next turn then prefills only what the
    # last turn appended (the native engine). vLLM finds such prefixes itself (enable_prefix_caching).
    keeps_kv_across_calls: bool = False
    # Whether generate() parks at a step boundary while WeightGate.updating() runs and goes on under the new weights
    # (partial rollouts on split pools), and takes `until` / `carried`: ends a call part-way and goes on with its rows
    # in a later one (colocate_async). Else an update waits for the call in flight to finish.
    resumes_generation: bool = False

    @cached_property
    def gate(self) -> WeightGate:
        return WeightGate()

    @abstractmethod
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams) -> RolloutOutput:
        """Samples one response per (left-padded) prompt row. `input_ids`, `attention_mask`: `[batch, prompt_len]`."""

    def load_adapters(self, adapters: Adapters) -> None:
        """LoRA without merging (`model.lora.merge=False`): holds `adapters` over the base weights the first sync
        loaded (replacing one held under the same name); generation applies the one `SamplingParams.adapter` names,
        by default the policy's ("default")."""
        raise NotImplementedError(f"{type(self).__name__} cannot apply LoRA adapters; set actor_rollout_ref.model.lora.merge=True "
                                  "(the rollout then gets merged weights)")

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads full tensors under HF names into the engine's model, consuming the iterator lazily.

        One call carries every weight: engines like vLLM post-process each layer once it is complete, so
        the stream must not be cut into several calls at arbitrary boundaries.
        """

    def sleep(self, level: int = 2) -> None:
        """Frees generation memory between rollouts: level 1 the KV cache (and what points into it), level 2 the
        weights as well, for a sync that sends every weight anyway (vLLM's levels; rlcore.workers.phases)."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-acquires what sleep() freed: "weights" before a weight update, "kv_cache" before generating."""

    def memory_bytes(self) -> dict[str, int]:
        """What the engine holds on its device now, for the memory ledger: "rollout_weights" and "kv_cache" bytes
        (empty where the engine cannot say)."""
        return {}

    def state_dict(self) -> dict:
        """Engine state a checkpoint must carry for an exact resume (e.g. the sampling RNG)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def assemble_sequences(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, out: RolloutOutput) -> dict[str, torch.Tensor]:
    """Concatenates prompt and response into the training layout used by every worker.

    input_ids `[batch, prompt_len + response_len]`, attention_mask (0 on left prompt padding and right response
    padding), position_ids counting real tokens only, so a left-padded row sees the same positions as unpadded.
    `response_mask` is what the losses, advantages, KL and entropy average over: the sampled tokens.
    """
    attention_mask = torch.cat([prompt_mask, out.response_mask.to(prompt_mask.dtype)], dim=-1)
    sampled = out.response_mask if out.loss_mask is None else out.loss_mask
    position_ids = position_ids_from_mask(attention_mask)
    sequences = {
        "prompts": prompt_ids,
        "responses": out.responses,
        "input_ids": torch.cat([prompt_ids, out.responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": sampled.to(prompt_mask.dtype),
        "rollout_log_probs": out.response_log_probs,
    }
    if out.versions is not None:
        sequences["rollout_versions"] = out.versions
    if out.routed_experts is not None:
        sequences["routed_experts"] = out.routed_experts  # rlcore.models.router.ROUTES
    return sequences
