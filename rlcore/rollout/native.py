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


def group_size(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """n when the rows come in runs of n identical prompts (the trainer repeats each prompt rollout.n times,
    interleaved), else 1."""
    batch = input_ids.shape[0]
    same = ((input_ids == input_ids[:1]) & (attention_mask == attention_mask[:1])).all(-1)
    n = int(same.int().cumprod(0).sum())  # length of the first run
    if n <= 1 or batch % n:
        return 1
    grouped_ids, grouped_mask = input_ids.view(batch // n, n, -1), attention_mask.view(batch // n, n, -1)
    identical = (grouped_ids == grouped_ids[:, :1]).all() and (grouped_mask == grouped_mask[:, :1]).all()
    return n if bool(identical) else 1


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
        (batch, prompt_len), max_tokens = input_ids.shape, sampling.max_tokens
        stop_ids = torch.tensor(sampling.stop_token_ids or [-1], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed) if sampling.seed is not None else self.generator
        position_ids = position_ids_from_mask(attention_mask)  # left padding stays invisible to RoPE
        # Prefix sharing: the n samples of a prompt arrive as n identical rows; each prompt is prefilled once and its
        # KV cache repeated for its samples.
        n = group_size(input_ids, attention_mask)
        cache = DynamicCache()
        logits = self.model(input_ids=input_ids[::n], attention_mask=attention_mask[::n], position_ids=position_ids[::n],
                            past_key_values=cache, use_cache=True).logits[:, -1]
        if n > 1:
            for layer in cache.layers:
                layer.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
        # Preallocated outputs and attention mask: nothing is re-concatenated per token.
        responses = torch.full((batch, max_tokens), self.pad_token_id, dtype=torch.long, device=self.device)
        log_probs = torch.zeros(batch, max_tokens, device=self.device)
        alive = torch.zeros(batch, max_tokens, dtype=torch.bool, device=self.device)
        mask = torch.cat([attention_mask, attention_mask.new_ones(batch, max_tokens)], dim=-1)
        rows = torch.arange(batch, device=self.device)  # batch rows still decoding, in the cache's order
        next_pos = position_ids[:, -1] + 1
        for t in range(max_tokens):
            token, log_prob = sample_next(logits, sampling, generator)
            responses[rows, t], log_probs[rows, t], alive[rows, t] = token, log_prob.float(), True
            done = torch.isin(token, stop_ids)
            if bool(done.all()) or t == max_tokens - 1:
                break
            if bool(done.any()):  # finished sequences leave the decode batch, and their rows of the KV cache
                keep = (~done).nonzero().squeeze(-1)
                rows, token, next_pos = rows[keep], token[keep], next_pos[keep]
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
            logits = self.model(input_ids=token[:, None], attention_mask=mask[rows, : prompt_len + t + 1], position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        return RolloutOutput(responses=responses.cpu(), response_log_probs=log_probs.cpu(), response_mask=alive.long().cpu())

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def sleep(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the KV cache died with generate(); hand its blocks back to the allocator
