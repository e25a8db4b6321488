"""The server agent loops talk to (verl's AsyncLLMServerManager): `await generate(request_id, prompt_ids=...,
sampling_params=...)` -> TokenOutput, over the rollout worker's engine, native or vLLM.

Each row's loop is a coroutine; the engine takes batches. The server gathers the requests of every loop that is
waiting and sends them as one engine call: it dispatches as soon as every live loop is waiting, or once no new
request has come for `settle_s` (a loop busy in a tool call does not hold the others back). The engine call runs
in a worker thread, so loops keep running (tools, interactions, their own code) while it decodes, and their next
requests form the next batch. Requests with different sampling settings go in separate calls.

Token budget per request, as verl's vLLM server: `max_tokens` (or `max_new_tokens`) from the request, else what
is left of prompt_length + response_length after the prompt. The native engine keeps the KV of the last call's
rows: a request whose `request_id` was in that call and whose prompt extends that row's ids prefills only what was
appended (verl's sticky sessions: a multi-turn loop reuses its request_id).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rlcore.rollout.agent_api import TokenOutput
from rlcore.rollout.base import RolloutEngine, SamplingParams


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future


# logprobs: always returned; repetition_penalty: only its neutral 1.0 (the engines apply none)
SUPPORTED = {"temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "logprobs", "repetition_penalty"}


class BatchingServer:
    """One rollout worker's engine behind verl's async `generate`. Use inside an event loop; `live` is the number of
    loops running (the runner keeps it), which lets a batch go the moment all of them wait."""

    def __init__(self, engine: RolloutEngine, sampling: SamplingParams, pad_token_id: int, max_model_len: int,
                 settle_s: float = 0.05) -> None:
        self.engine, self.base, self.pad, self.max_model_len, self.settle_s = engine, sampling, pad_token_id, max_model_len, settle_s
        self.pending: list[_Request] = []
        self.live = 0
        self.dispatcher: asyncio.Task | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlcore-engine")
        self.last: dict[str, tuple[int, list[int]]] = {}  # request_id -> (row, ids) of the last engine call
        self.stats = {"agent/engine_calls": 0.0, "agent/requests": 0.0, "agent/prefill_tokens": 0.0, "agent/reused_tokens": 0.0}

    async def generate(self, request_id: Any, *, prompt_ids: list[int], sampling_params: dict[str, Any] | None = None,
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError("image_data / video_data: rlcore's agent server takes text models only so far")
        future = asyncio.get_running_loop().create_future()
        self.pending.append(_Request(str(request_id), [int(t) for t in prompt_ids], self._sampling(prompt_ids, sampling_params or {}), future))
        if self.dispatcher is None or self.dispatcher.done():
            self.dispatcher = asyncio.ensure_future(self._dispatch())
        return await future

    def close(self) -> None:
        self.executor.shutdown(wait=True)

    def _sampling(self, prompt_ids: list[int], params: dict[str, Any]) -> SamplingParams:
        unknown = set(params) - SUPPORTED
        if unknown:
            raise ValueError(f"sampling_params {sorted(unknown)} are not supported by rlcore's agent server (it takes {sorted(SUPPORTED)})")
        if params.get("repetition_penalty", 1.0) != 1.0:
            raise ValueError("sampling_params repetition_penalty != 1.0: the rollout engines do not apply one")
        room = self.max_model_len - len(prompt_ids)
        budget = params.get("max_tokens", params.get("max_new_tokens", room))
        keep = {k: params[k] for k in ("temperature", "top_p", "top_k") if params.get(k) is not None}
        return replace(self.base, max_tokens=max(0, min(int(budget), room)), **keep)

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending:
            await self._settle()
            batch, self.pending = self.pending, []
            for group in _by_settings(batch):
                try:
                    outs = await loop.run_in_executor(self.executor, self._call, group)
                except BaseException as err:  # noqa: BLE001 -- every waiting loop learns why, the step fails with it
                    for r in group:
                        if not r.future.done():
                            r.future.set_exception(err)
                    continue
                for r, out in zip(group, outs):
                    if not r.future.done():
                        r.future.set_result(out)

    async def _settle(self) -> None:
        """Returns once every live loop waits here, or no new request came for settle_s."""
        count, quiet = len(self.pending), time.monotonic()
        while len(self.pending) < self.live:
            await asyncio.sleep(self.settle_s / 5)
            if len(self.pending) != count:
                count, quiet = len(self.pending), time.monotonic()
            elif time.monotonic() - quiet >= self.settle_s:
                return

    def _call(self, group: list[_Request]) -> list[TokenOutput]:
        """One engine call for requests sharing their sampling settings (runs in the engine thread)."""
        live = [r for r in group if r.sampling.max_tokens > 0]
        outs = {id(r): TokenOutput([], [], stop_reason="length") for r in group if r.sampling.max_tokens <= 0}
        if live:
            import torch

            width = max(len(r.prompt_ids) for r in live)
            ids = torch.tensor([[self.pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in live])
            mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in live])
            kwargs = self._kept_kv(live)
            out = self.engine.generate(ids, mask, replace(live[0].sampling, max_tokens=max(r.sampling.max_tokens for r in live)), **kwargs)
            self.stats["agent/engine_calls"] += 1
            self.stats["agent/requests"] += len(live)
            engine_stats = getattr(self.engine, "stats", {})
            self.stats["agent/prefill_tokens"] += engine_stats.get("prefill_tokens", int(mask.sum()))
            self.stats["agent/reused_tokens"] += engine_stats.get("reused_tokens", 0)
            stops = set(self.base.stop_token_ids)
            self.last = {}
            for j, r in enumerate(live):
                n = min(int(out.response_mask[j].sum()), r.sampling.max_tokens)
                tokens = out.responses[j, :n].tolist()
                outs[id(r)] = TokenOutput(tokens, out.response_log_probs[j, :n].tolist(),
                                          stop_reason="completed" if tokens and tokens[-1] in stops else "length")
                self.last[r.request_id] = (j, r.prompt_ids + tokens)
        return [outs[id(r)] for r in group]

    def _kept_kv(self, live: list[_Request]) -> dict:
        """keep_kv / prefix_of for an engine that keeps each row's KV between calls (the native one)."""
        if not self.engine.keeps_kv_across_calls:
            return {}
        prefix_of = []
        for r in live:
            row, ids = self.last.get(r.request_id, (None, None))
            prefix_of.append(row if ids is not None and r.prompt_ids[: len(ids)] == ids else None)
        return {"keep_kv": True, **({"prefix_of": prefix_of} if any(p is not None for p in prefix_of) else {})}


def _by_settings(batch: list[_Request]) -> list[list[_Request]]:
    groups: dict[tuple, list[_Request]] = {}
    for r in batch:
        groups.setdefault((r.sampling.temperature, r.sampling.top_p, r.sampling.top_k), []).append(r)
    return list(groups.values())
