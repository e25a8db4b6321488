"""The embedded rollout engine: batched prefill + incremental decode over a KV cache, on any device."""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import DynamicCache

from rlcore.models.hf import load_causal_lm, to_torch_dtype
from rlcore.protocol import position_ids_from_mask
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Masks (to -inf) tokens outside the top-k and outside the smallest set with cumulative prob >= top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token if the mass BEFORE it already reaches top_p; the most likely token always stays.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Picks the next token per row; returns (tokens [batch], log-probs [batch]) under the processed distribution."""
    logits = logits.float()
    if sampling.greedy:
        tokens = logits.argmax(-1)
        return tokens, torch.gather(logits.log_softmax(-1), -1, tokens[:, None]).squeeze(-1)
    logits = filter_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    log_probs = logits.log_softmax(-1)
    tokens = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
    return tokens, torch.gather(log_probs, -1, tokens[:, None]).squeeze(-1)


class NativeRollout(RolloutEngine):
    """Holds its own (unsharded) copy of the policy, refreshed by `update_weights` before each rollout."""

    def __init__(self, model_path: str | None, pad_token_id: int, device: torch.device, dtype: str = "float32", override_config: dict | None = None,
                 seed: int = 0, model: torch.nn.Module | None = None) -> None:
        """Builds its own copy of the architecture at `model_path`, or decodes with `model` as given (no copy)."""
        self.device = device
        self.pad_token_id = pad_token_id
        if model is None:
            model = load_causal_lm(model_path, override_config, dtype=to_torch_dtype(dtype), weights=False).to(device)
            model.requires_grad_(False)
        self.model = model
        self._params = dict(self.model.named_parameters())
        self._params.update(dict(self.model.named_buffers()))
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            if name not in self._params:
                raise KeyError(f"rollout model has no weight {name!r}; the training and rollout architectures differ")
            self._params[name].copy_(tensor.to(self.device))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams) -> RolloutOutput:
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(input_ids, attention_mask, sampling)
        finally:
            self.model.train(was_training)

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams) -> RolloutOutput:
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        batch = input_ids.shape[0]
        stop_ids = torch.tensor(sampling.stop_token_ids or [-1], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed) if sampling.seed is not None else self.generator
        position_ids = position_ids_from_mask(attention_mask)  # left padding stays invisible to RoPE
        cache = DynamicCache()
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache, use_cache=True).logits[:, -1]
        next_pos = position_ids[:, -1] + 1
        tokens, log_probs, alive = [], [], []
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        for _ in range(sampling.max_tokens):
            token, log_prob = sample_next(logits, sampling, generator)
            alive.append(~finished)
            tokens.append(torch.where(finished, self.pad_token_id, token))
            log_probs.append(torch.where(finished, 0.0, log_prob))
            finished = finished | torch.isin(token, stop_ids)
            if bool(finished.all()):
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=-1)
            logits = self.model(input_ids=tokens[-1][:, None], attention_mask=attention_mask, position_ids=next_pos[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        return self._pad(tokens, log_probs, alive, sampling.max_tokens)

    def _pad(self, tokens: list, log_probs: list, alive: list, max_tokens: int) -> RolloutOutput:
        """Stacks per-step columns and right-pads to max_tokens so every batch has one response width."""
        batch = tokens[0].shape[0]
        pad = max_tokens - len(tokens)
        responses = torch.stack(tokens, 1)
        mask = torch.stack(alive, 1).long()
        lps = torch.stack(log_probs, 1)
        if pad:
            responses = torch.cat([responses, responses.new_full((batch, pad), self.pad_token_id)], 1)
            mask = torch.cat([mask, mask.new_zeros(batch, pad)], 1)
            lps = torch.cat([lps, lps.new_zeros(batch, pad)], 1)
        return RolloutOutput(responses=responses.cpu(), response_log_probs=lps.float().cpu(), response_mask=mask.cpu())

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def sleep(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the KV cache died with generate(); hand its blocks back to the allocator
