"""Supervised warm-start: teacher-forced cross-entropy on response tokens only (single process).

Used by the tiny demo to teach a randomly initialised model the answer format before RL; the layout is the
same one RL uses (left-padded prompt + right-padded response), so the loss sees exactly the RL positions.
"""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import torch

from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.protocol import position_ids_from_mask


def tokenize_sft(rows: list[dict], tokenizer, max_prompt_length: int, max_response_length: int) -> dict[str, torch.Tensor]:
    """Prompt (chat template, left-padded) + response + EOS (right-padded): `[rows, P + R]` tensors."""
    pad = tokenizer.pad_token_id
    input_ids, masks, responses, response_masks = [], [], [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
        response = tokenizer.encode(row["response"], add_special_tokens=False) + [tokenizer.eos_token_id]
        if len(prompt) > max_prompt_length or len(response) > max_response_length:
            raise ValueError(f"SFT row too long (prompt {len(prompt)}, response {len(response)}); raise the length limits")
        p_pad, r_pad = max_prompt_length - len(prompt), max_response_length - len(response)
        input_ids.append([pad] * p_pad + prompt + response + [pad] * r_pad)
        masks.append([0] * p_pad + [1] * (len(prompt) + len(response)) + [0] * r_pad)
        responses.append(response + [pad] * r_pad)
        response_masks.append([1] * len(response) + [0] * r_pad)
    attention_mask = torch.tensor(masks)
    return {
        "input_ids": torch.tensor(input_ids), "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "responses": torch.tensor(responses), "response_mask": torch.tensor(response_masks),
    }


def read_sft_rows(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def greedy_accuracy(model, tokenizer, rows: list[dict], max_prompt_length: int, max_response_length: int) -> float:
    """Fraction of `rows` whose greedy answer scores 1 under the rule scorer of their data_source."""
    from rlcore.reward.scorers import default_compute_score
    from rlcore.rollout.base import SamplingParams
    from rlcore.rollout.native import NativeRollout

    data = tokenize_sft(rows, tokenizer, max_prompt_length, max_response_length)
    prompt_ids = data["input_ids"][:, :max_prompt_length]
    prompt_mask = data["attention_mask"][:, :max_prompt_length]
    rollout = NativeRollout(None, tokenizer.pad_token_id, torch.device("cpu"), model=model)
    greedy = SamplingParams(max_tokens=max_response_length, do_sample=False, stop_token_ids=[tokenizer.eos_token_id])
    out = rollout.generate(prompt_ids, prompt_mask, greedy)
    texts = tokenizer.batch_decode([r[: int(m.sum())] for r, m in zip(out.responses, out.response_mask)], skip_special_tokens=True)
    scores = [default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"]) for row, text in zip(rows, texts)]
    return sum(scores) / len(scores)


def train_sft(model, data: dict[str, torch.Tensor], steps: int, batch_size: int, lr: float, seed: int, warmup_steps: int = 20,
              log_every: int = 100, stop_fn=None, stop_every: int = 25) -> list[float]:
    """AdamW (linear warmup, then constant lr) on the token-mean response NLL; returns every step's loss.

    `stop_fn(step) -> bool`, checked every `stop_every` steps, ends training early (e.g. at a target accuracy).
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    response_len = data["responses"].shape[-1]
    losses, start = [], time.perf_counter()
    model.train()
    for step in range(steps):
        idx = torch.randint(0, data["input_ids"].shape[0], (batch_size,), generator=generator)
        logits = model(input_ids=data["input_ids"][idx], attention_mask=data["attention_mask"][idx], position_ids=data["position_ids"][idx], use_cache=False).logits
        log_probs = gather_log_probs(response_logits(logits, response_len), data["responses"][idx])
        mask = data["response_mask"][idx].float()
        loss = -(log_probs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"sft step {step + 1}/{steps} loss {loss.item():.4f} ({time.perf_counter() - start:.1f}s)", flush=True)
        if stop_fn is not None and (step + 1) % stop_every == 0 and stop_fn(step + 1):
            break
    model.eval()
    return losses
