"""The rollout-engine seam. Native (embedded) and vLLM engines both implement `RolloutEngine`.

Prompts cross the seam as left-padded token-id tensors; responses come back right-padded with their log-probs.
The vLLM adapter strips the padding into token-id lists (vLLM's `TokensPrompt`) and pads the outputs back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import torch

from rlcore.protocol import position_ids_from_mask


WEIGHT_BUCKET_BYTES = 2048 * 2**20  # verl: rollout.checkpoint_engine.update_weights_bucket_megabytes=2048


class WeightSource(Protocol):
    """What the hybrid engine reads the training weights from (every TrainEngine is one): full tensors under HF
    names, gathered `bucket_bytes` at a time; `transient`: a tensor may be overwritten once the next is yielded;
    `adapted_only`: with LoRA, only the weights the adapters change (merged)."""

    def rollout_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES, transient: bool = False,
                        adapted_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]: ...


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                     # -1 or 0: off (verl / vLLM convention)
    do_sample: bool = True              # False: greedy
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

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


class RolloutEngine(ABC):
    # Whether weights loaded by update_weights stay loaded across sleep(): then a LoRA run sends only the weights its
    # adapters change. vLLM's sleep(level=2) discards them, so every sync there reloads every weight.
    keeps_weights: bool = True
    # Whether generate() takes keep_kv / prefix_of: a multi-turn trajectory's next turn then prefills only what the
    # last turn appended (the native engine). vLLM finds such prefixes itself (enable_prefix_caching).
    keeps_kv_across_calls: bool = False

    @abstractmethod
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams) -> RolloutOutput:
        """Samples one response per (left-padded) prompt row. `input_ids`, `attention_mask`: `[batch, prompt_len]`."""

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads full tensors under HF names into the engine's model, consuming the iterator lazily.

        One call carries every weight: engines like vLLM post-process each layer once it is complete, so
        the stream must not be cut into several calls at arbitrary boundaries.
        """

    def sleep(self) -> None:
        """Frees generation memory (KV cache; with vLLM also the weights) between rollouts."""

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
    return {
        "prompts": prompt_ids,
        "responses": out.responses,
        "input_ids": torch.cat([prompt_ids, out.responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": sampled.to(prompt_mask.dtype),
        "rollout_log_probs": out.response_log_probs,
    }
