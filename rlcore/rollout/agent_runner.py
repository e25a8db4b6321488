"""Agent loops chosen per row by name (verl's `agent_name`, default `agent.default_agent_loop`), over one rollout
engine: rlcore's two built-in loops and the custom ones of `agent.agent_loop_config_path`.

- `single_turn_agent`: the rows' prompts in one engine call (no loop object: the fastest path).
- `tool_agent`: the hermes tool agent (rlcore.rollout.agent_loop.AgentLoop), in waves over its rows.
- a custom loop (rlcore.rollout.agent_api.AgentLoopBase, verl's shape): one instance and one coroutine per row, all
  rows side by side on an event loop, their requests batched into engine calls by rlcore.rollout.agent_server.

The rows' trajectories come back as one batch: each row's own prompt ids (a custom loop may render the prompt
itself) left-padded to the batch's prompt width, its response right-padded to the response budget, the sampled
ids marked in `loss_mask`, with the counters of the tool agent (zero for other rows), the loops' `turn_scores`
and, where a loop scored its row, `agent_reward` (NaN elsewhere: compute_score scores those).
"""

from __future__ import annotations

import asyncio
import importlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlcore.config.agent_loop_config import BUILTIN_AGENT_LOOPS, AgentLoopSpec
from rlcore.config.typed import as_dictconfig
from rlcore.rollout.agent_api import AgentLoopOutput, DictConfigWrap, _agent_loop_registry
from rlcore.rollout.agent_loop import TURN_COUNTERS, AgentLoop, left_pad
from rlcore.rollout.agent_server import BatchingServer
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams


@dataclass
class _Row:
    """One row's trajectory, whichever loop made it."""

    prompt: list[int]
    response: list[int]
    sampled: list[int]
    log_probs: list[float]
    counters: dict[str, float]
    turn_scores: list[float] | None = None
    reward: float = math.nan


class AgentRunner:
    """Routes each row of a rollout batch to its agent loop and assembles the trajectories (one per rollout worker)."""

    def __init__(self, engine: RolloutEngine, tokenizer, config, loops: list[AgentLoopSpec], default: str,
                 tool_loop: AgentLoop | None, prompt_width: int) -> None:
        self.engine, self.tokenizer, self.config, self.default, self.tool_loop = engine, tokenizer, config, default, tool_loop
        self.loops = {name: dict(spec) for name, spec in _agent_loop_registry.items()}  # @register'ed, then the YAML's
        self.loops.update({s.name: {"_target_": s.target, **s.kwargs} for s in loops})
        self.prompt_width = prompt_width
        self.stats: dict[str, float] = {}

    def close(self) -> None:
        if self.tool_loop is not None:
            self.tool_loop.close()

    def generate_batch(self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams, rows: dict[str, np.ndarray]
                       ) -> tuple[torch.Tensor, torch.Tensor, RolloutOutput, dict[str, Any]]:
        names = [n if isinstance(n, str) else self.default for n in rows.get("agent_name", [None] * len(ids))]
        unknown = sorted(set(names) - {*BUILTIN_AGENT_LOOPS, *self.loops})
        if unknown:
            raise ValueError(f"agent_name {unknown} are not agent loops here (built in: single_turn_agent, tool_agent; "
                             f"agent_loop_config_path: {', '.join(sorted(self.loops)) or 'none'})")
        self.stats = {}
        done: dict[int, _Row] = {}
        by_name: dict[str, list[int]] = {}
        for r, name in enumerate(names):
            by_name.setdefault(name, []).append(r)
        for name, which in by_name.items():
            if name in BUILTIN_AGENT_LOOPS:
                done.update(self._batch_loop(name, which, ids, mask, sampling, rows))
        custom = [r for r in range(len(ids)) if names[r] not in BUILTIN_AGENT_LOOPS]
        if custom:
            done.update(self._custom(custom, names, ids, mask, sampling, rows))
        return self._assemble([done[r] for r in range(len(ids))], sampling.max_tokens)

    def _batch_loop(self, name: str, which: list[int], ids, mask, sampling, rows) -> dict[int, _Row]:
        sub_ids, sub_mask = ids[which], mask[which]
        if name == "single_turn_agent":
            out, counters = self.engine.generate(sub_ids, sub_mask, sampling), {}
        else:
            if self.tool_loop is None:
                raise ValueError("agent_name tool_agent needs multi-turn rollouts: set actor_rollout_ref.rollout.multi_turn.enable=True "
                                 "and a tool_config_path")
            column = lambda key: [rows[key][r] for r in which] if key in rows else None  # noqa: E731
            out, counters = self.tool_loop.run(sub_ids, sub_mask, sampling, column("tools_kwargs"), column("interaction_kwargs"),
                                               column("raw_prompt"))
            for k, v in self.tool_loop.stats.items():
                self.stats[k] = self.stats.get(k, 0.0) + v
        sampled = out.response_mask if out.loss_mask is None else out.loss_mask
        result = {}
        for j, r in enumerate(which):
            n = int(out.response_mask[j].sum())
            scores = counters.get("turn_scores")
            result[r] = _Row(ids[r][mask[r].bool()].tolist(), out.responses[j, :n].tolist(), sampled[j, :n].tolist(),
                             out.response_log_probs[j, :n].tolist(),
                             {k: float(counters[k][j]) for k in TURN_COUNTERS if k in counters},
                             None if scores is None else list(scores[j]))
        return result

    def _custom(self, which: list[int], names: list[str], ids, mask, sampling, rows) -> dict[int, _Row]:
        """The custom loops' rows, side by side on an event loop, through the batching server."""
        server = BatchingServer(self.engine, sampling, self.tokenizer.pad_token_id, self.prompt_width + sampling.max_tokens)
        params = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                  "repetition_penalty": 1.0, "logprobs": True}
        if sampling.greedy:
            params["temperature"] = 0.0
        verl_config = as_dictconfig(self.config)  # what verl hands a loop, which may read it with .get

        async def one(r: int) -> AgentLoopOutput:
            spec = self.loops[names[r]]
            kwargs = {k: v for k, v in spec.items() if k != "_target_"}
            module, _, attr = spec["_target_"].rpartition(".")
            loop = getattr(importlib.import_module(module), attr)(
                trainer_config=DictConfigWrap(verl_config), server_manager=server, tokenizer=self.tokenizer, processor=None,
                dataset_cls=None, dataset_config=DictConfigWrap(verl_config.data), **kwargs)
            row = {key: column[r] for key, column in rows.items()}
            row.setdefault("raw_prompt", None)
            try:
                return await loop.run(dict(params), **row)
            except Exception as err:  # noqa: BLE001 -- the user's loop; the step stops with its name and row
                raise RuntimeError(f"agent loop {names[r]!r} ({spec['_target_']}) failed on row {r}: {type(err).__name__}: {err}") from err
            finally:
                server.live -= 1

        async def all_rows() -> list[AgentLoopOutput]:
            server.live = len(which)
            # Every loop runs to its end (a failed one leaves no task behind), then the first failure stops the step.
            results = await asyncio.gather(*(one(r) for r in which), return_exceptions=True)
            failed = next((x for x in results if isinstance(x, BaseException)), None)
            if failed is not None:
                raise failed
            if server.dispatcher is not None:
                await server.dispatcher
            return results

        events = asyncio.new_event_loop()
        try:
            outputs = events.run_until_complete(all_rows())
        finally:
            events.close()
            server.close()
        for k, v in server.stats.items():
            self.stats[k] = self.stats.get(k, 0.0) + v
        # The loops' own numeric metrics (verl's timings; an agent program's errors and timeouts), averaged over rows.
        numeric = [{k: float(v) for k, v in (o.metrics or {}).items() if isinstance(v, (int, float))}
                   for o in outputs if isinstance(o.metrics, dict)]
        for k in {k for m in numeric for k in m}:
            self.stats[f"agent/metrics/{k}"] = sum(m.get(k, 0.0) for m in numeric) / len(numeric)
        return {r: self._row(o, sampling.max_tokens, names[r]) for r, o in zip(which, outputs)}

    def _row(self, o: AgentLoopOutput, budget: int, name: str) -> _Row:
        if len(o.prompt_ids) > self.prompt_width:
            raise ValueError(f"agent loop {name!r} returned a prompt of {len(o.prompt_ids)} tokens, more than data.max_prompt_length="
                             f"{self.prompt_width}; raise data.max_prompt_length")
        if len(o.response_mask) != len(o.response_ids):
            raise ValueError(f"agent loop {name!r}: response_mask has {len(o.response_mask)} entries for {len(o.response_ids)} response ids")
        n = min(len(o.response_ids), budget)  # verl cuts to response_length too
        log_probs = list(o.response_logprobs or [0.0] * n)[:n]
        extra = o.extra_fields or {}
        counters = {"num_turns": float(o.num_turns), "tool_rewards": float(sum(extra.get("tool_rewards") or []))}
        scores = extra.get("turn_scores")
        return _Row(list(o.prompt_ids), list(o.response_ids[:n]), [int(m) for m in o.response_mask[:n]], log_probs, counters,
                    None if scores is None else [float(s) for s in scores], math.nan if o.reward_score is None else float(o.reward_score))

    def _assemble(self, done: list[_Row], budget: int) -> tuple[torch.Tensor, torch.Tensor, RolloutOutput, dict[str, Any]]:
        pad = self.tokenizer.pad_token_id
        ids, mask = left_pad([d.prompt for d in done], pad)
        if ids.shape[1] < self.prompt_width:  # the batch keeps the data's prompt width (workers' outputs are concatenated)
            extra = self.prompt_width - ids.shape[1]
            ids = torch.cat([torch.full((len(done), extra), pad), ids], 1)
            mask = torch.cat([torch.zeros(len(done), extra, dtype=mask.dtype), mask], 1)
        fill = lambda values, v: torch.tensor([x + [v] * (budget - len(x)) for x in values])  # noqa: E731
        out = RolloutOutput(responses=fill([d.response for d in done], pad), response_log_probs=fill([d.log_probs for d in done], 0.0).float(),
                            response_mask=fill([[1] * len(d.response) for d in done], 0), loss_mask=fill([d.sampled for d in done], 0))
        counters: dict[str, Any] = {k: torch.tensor([d.counters.get(k, 0.0) for d in done],
                                                    dtype=torch.float32 if k == "tool_rewards" else torch.long) for k in TURN_COUNTERS}
        counters["agent_reward"] = torch.tensor([d.reward for d in done], dtype=torch.float32)
        if any(d.turn_scores is not None for d in done):
            counters["turn_scores"] = np.empty(len(done), dtype=object)
            counters["turn_scores"][:] = [list(d.turn_scores or []) for d in done]
        return ids, mask, out, counters
