"""What the OpenAI-compatible endpoint costs per call against a verl-shaped agent loop, in one run (docs/multi-turn.md).

The same conversation shape both ways, over an engine that answers at once (so only the agent machinery is timed):
each of ROWS rows makes CALLS calls, a user turn between them. (a) a custom loop calls `server_manager.generate`
with token ids; (b) an agent program calls the endpoint with the `openai` client (HTTP, JSON, the chat template on
the first call, the history check and the rendered continuation on later ones), with one client per process or
a client per trajectory. Prints the wall ms per call of each (all rows side by side) and the differences, best of
REPEATS.

    .venv/bin/python bench/agent_endpoint.py
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch
from openai import OpenAI

from rlcore.config import compose
from rlcore.config.agent_loop_config import AgentLoopSpec
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.rollout.agent_api import AgentLoopBase, AgentLoopOutput
from rlcore.rollout.agent_loop import left_pad
from rlcore.rollout.agent_runner import AgentRunner
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

ROWS, CALLS, REPEATS = 64, 3, 3
TIMEOUT_S = 10.0
ANSWER = "42"


class Instant(RolloutEngine):
    """Answers every row with ANSWER and EOS at once."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(self, input_ids, attention_mask, sampling):
        rows, width = len(input_ids), sampling.max_tokens
        ids = torch.tensor([self.ids + [0] * (width - len(self.ids))] * rows)
        mask = torch.tensor([[1] * len(self.ids) + [0] * (width - len(self.ids))] * rows)
        return RolloutOutput(ids, mask.float() * -0.5, mask)

    def update_weights(self, weights):
        pass


class TokenLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        prompt = await self.apply_chat_template(list(row["raw_prompt"]))
        response, mask = [], []
        for turn in range(CALLS):
            out = await self.server_manager.generate(f"r{row['index']}", prompt_ids=prompt + response, sampling_params=sampling_params)
            response, mask = response + out.token_ids, mask + [1] * len(out.token_ids)
            if turn < CALLS - 1:
                user = await self.apply_chat_template([{"role": "user", "content": "again"}], remove_system_prompt=True)
                response, mask = response + user, mask + [0] * len(user)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask, num_turns=2 * CALLS)


_SHARED: dict[str, OpenAI] = {}


def program(base_url: str, api_key: str, raw_prompt, **row) -> None:
    """A fresh client per trajectory, as most agent code builds one (~50 ms each here: httpx loads its TLS
    certificates even for http://)."""
    converse(OpenAI(base_url=base_url, api_key=api_key, max_retries=0), raw_prompt)


def program_shared_client(base_url: str, api_key: str, raw_prompt, **row) -> None:
    """One client per process, the trajectory's key per call (with_options shares the connection pool)."""
    if base_url not in _SHARED:
        _SHARED[base_url] = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    converse(_SHARED[base_url].with_options(api_key=api_key), raw_prompt)


def program_failing(base_url: str, api_key: str, raw_prompt, index, **row) -> None:
    """Row 0 crashes at once, row 1 hangs (past timeout_s), the rest converse."""
    if index == 0:
        raise RuntimeError("agent bug")
    if index == 1:
        time.sleep(60)
    program_shared_client(base_url, api_key, raw_prompt)


def converse(client: OpenAI, raw_prompt) -> None:
    messages = list(raw_prompt)
    for _ in range(CALLS):
        message = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]


def main() -> None:
    tokenizer = build_char_tokenizer()
    cfg = compose(["recipe=tiny_cpu", "data.max_response_length=64"])
    chats = [[{"role": "user", "content": f"{i}+{i}="}] for i in range(ROWS)]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in chats]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered], tokenizer.pad_token_id)
    raw = np.empty(ROWS, dtype=object)
    raw[:] = chats
    rows = {"raw_prompt": raw, "index": np.arange(ROWS)}
    sampling = SamplingParams(max_tokens=64, stop_token_ids=[tokenizer.eos_token_id])
    loops = {"token loop (server_manager.generate)": AgentLoopSpec("a", f"{__name__}.TokenLoop", {"name": "a"}),
             "agent program, one client per process": AgentLoopSpec(
                 "c", "rlcore.rollout.agent_program.AgentProgramLoop", {"name": "c", "program": f"{__file__}:program_shared_client"}),
             "agent program, a client per trajectory": AgentLoopSpec(
                 "b", "rlcore.rollout.agent_program.AgentProgramLoop", {"name": "b", "program": f"{__file__}:program"})}
    ms = {}
    for label, spec in loops.items():
        runner = AgentRunner(Instant(tokenizer), tokenizer, cfg, [spec], spec.name, None, ids.shape[1])
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            _, _, out, _ = runner.generate_batch(ids, mask, sampling, rows)
            best = min(best, time.perf_counter() - start)
        assert int(out.loss_mask.sum()) == ROWS * CALLS * 3  # "42" and EOS, every call of every row
        ms[label] = 1000 * best / (ROWS * CALLS)
        print(f"{label:40s} {ms[label]:7.2f} ms per call ({ROWS} rows x {CALLS} calls, engine calls {runner.stats['agent/engine_calls']:.0f})")
    failing = AgentLoopSpec("d", "rlcore.rollout.agent_program.AgentProgramLoop",
                            {"name": "d", "program": f"{__file__}:program_failing", "timeout_s": TIMEOUT_S})
    runner = AgentRunner(Instant(tokenizer), tokenizer, cfg, [failing], "d", None, ids.shape[1])
    start = time.perf_counter()
    _, _, out, counters = runner.generate_batch(ids, mask, sampling, rows)
    print(f"one row crashing and one hanging (timeout_s={TIMEOUT_S:g}): the batch took {time.perf_counter() - start:.2f} s "
          f"(all conversing: {ms[list(ms)[1]] * ROWS * CALLS / 1000:.2f} s); errors {runner.stats['agent/metrics/program_error'] * ROWS:.0f}, "
          f"timeouts {runner.stats['agent/metrics/program_timeout'] * ROWS:.0f}, rows scored failure_score "
          f"{int((counters['agent_reward'] == 0).sum())}")
    token, shared, fresh = ms.values()
    print(f"endpoint overhead per call: {shared - token:.2f} ms (one client per process), {fresh - token:.2f} ms (a client "
          f"per trajectory)")


if __name__ == "__main__":
    sys.path.insert(0, ".")
    main()
