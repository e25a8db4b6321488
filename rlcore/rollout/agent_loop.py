"""Multi-turn rollouts with tools (verl's ToolAgentLoop), token-in/token-out, over any RolloutEngine.

Each trajectory is one growing list of token ids. A turn generates from exactly the ids so far; the turn's text is
decoded only to find its tool calls (hermes `<tool_call>{...}</tool_call>`), never to rebuild the sequence; the
tool responses are rendered with the model's chat template and appended as ids, with the next generation prompt.
So the log-probs the actor trains on are the ones the policy sampled (re-tokenizing a decoded conversation gives
other ids: verl #3720). `loss_mask` is 1 only on sampled tokens; tool responses and template glue are context.

Turns run in waves: every live trajectory generates its next turn in one engine call, then every tool call of the
wave runs at once in the tool processes (rlcore.tools.runner), then the next wave. A trajectory with an interaction
(rlcore.tools.interaction: a simulated user, verl's interaction_config_path) hands each turn that called no tool to
it: its answer is appended as a user message (context, like tool responses), it may end the episode, and its turn
scores are returned per row (`turn_scores`, what the reward function gets as extra_info["turn_scores"]). The native engine keeps each
trajectory's KV between waves and prefills only what a turn appended (`NativeRollout.generate(keep_kv=...)`);
vLLM's prefix caching does the same on its side.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from rlcore.tools.interaction import InteractionSession, run_all
from rlcore.tools.parser import ParsedCall, parse_hermes
from rlcore.tools.runner import ToolCall, ToolResult, ToolRunner

TRUNCATED = "...(truncated)..."
# multi_turn.format -> parser; "qwen" is SGLang's name for the same <tool_call>{json}</tool_call> format (Qwen2.5 / 3)
PARSERS: dict[str, Callable[[str], list[ParsedCall]]] = {"hermes": parse_hermes, "qwen": parse_hermes}
# Per-trajectory columns of a multi-turn batch: counters, and the sum of the tools' step rewards (what a scorer can
# add to the outcome: the reward manager passes it as extra_info["tool_rewards"]).
TURN_COUNTERS = ("num_turns", "tool_calls", "tool_errors", "tool_timeouts", "truncated", "tool_rewards")


@dataclass(frozen=True)
class MultiTurnSettings:
    """`actor_rollout_ref.rollout.multi_turn.*` as the loop reads them."""

    max_assistant_turns: int | None = None   # None: until the response budget runs out
    max_user_turns: int | None = None        # tool-response turns; None: no cap
    max_parallel_calls: int = 1              # calls of one turn that run; later ones are dropped (verl)
    max_tool_response_length: int = 256      # characters of a tool's text kept
    tool_response_truncate_side: str = "middle"  # left (keep the start) | middle | right (keep the end)
    format: str = "hermes"


def truncate_text(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters (plus a marker): "left" keeps the start, "right" the end, "middle" both."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + TRUNCATED
    if side == "right":
        return TRUNCATED + text[-limit:]
    return text[: limit // 2] + TRUNCATED + text[len(text) - (limit - limit // 2):]


class ToolResponseIds:
    """The ids a trajectory continues with after an assistant turn that called tools: the template's glue after
    the turn's end token, the tool messages as the chat template renders them, and the next generation prompt.

    Found by rendering a fixed two-message conversation with and without the tool messages appended: what the
    longer rendering adds is exactly what the template would put there. A template that renders earlier messages
    differently once tool messages follow cannot be continued token-in/token-out, and is refused."""

    BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]

    def __init__(self, tokenizer, chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        # data.apply_chat_template_kwargs: the generation prompt after a tool turn must match the dataset's rendering
        # of the first one (Qwen3's enable_thinking=False adds an empty think block there).
        self.kwargs = dict(chat_template_kwargs or {})
        self.base = tokenizer.apply_chat_template(self.BASE, tokenize=False, **self.kwargs)
        # What the template writes after an assistant message's content: its end-of-turn token (which the model
        # samples, and which ends the turn) and any glue after it (Qwen: "<|im_end|>" then "\n").
        self.after_content = self.base[self.base.rindex("y") + 1:]

    def __call__(self, texts: list[str], stop_text: str, role: str = "tool") -> list[int]:
        """`texts`: the turn's tool responses (or an interaction's user message: role "user"), in order; `stop_text`:
        the text of the token that ended the turn."""
        return self.continuation([{"role": role, "content": t} for t in texts], stop_text)

    def continuation(self, new: list[dict], stop_text: str) -> list[int]:
        """The ids after an assistant turn ended by `stop_text` for the messages `new` (tool results, user turns,
        each as the chat template renders it) and the next generation prompt."""
        messages = [*self.BASE, *new]
        full = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **self.kwargs)
        if not full.startswith(self.base):
            raise ValueError("the chat template renders the conversation before a tool message differently once one follows, so "
                             "tool responses cannot be appended as ids; use a model whose template renders tool messages in order "
                             "(Qwen2.5, Qwen3, Llama 3.1)")
        glue = self.after_content[len(stop_text):] if self.after_content.startswith(stop_text) else self.after_content
        return self.tokenizer.encode(glue + full[len(self.base):], add_special_tokens=False)


@dataclass
class Trajectory:
    """One row: the prompt's ids, the response so far (sampled and appended ids), what each response id is."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)       # 1: sampled by the policy, 0: tool response / glue
    log_probs: list[float] = field(default_factory=list)   # the rollout's log-prob of each sampled id (0 elsewhere)
    stats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TURN_COUNTERS, 0))
    user_turns: int = 0
    done: bool = False
    versions: list[int] | None = None  # the weights versions of its first and last turn (start, end), if versioned
    # A mixture of experts' routes (R3) of the positions the last engine call's samples attended to, [positions,
    # layers, top_k]: the trajectory so far but its last sampled token and any tool response after it.
    routes: torch.Tensor | None = None
    # With an interaction: who answers its turns, the conversation as messages (what the interaction reads; the
    # prompt's own messages first when the data has them, data.return_raw_chat) and the scores of its answers.
    interaction: InteractionSession | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)

    def append(self, ids: list[int], log_probs: list[float] | None = None) -> None:
        self.ids += ids
        self.sampled += [int(log_probs is not None)] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)


class AgentLoop:
    """Runs multi-turn trajectories for a batch of prompts; one per rollout worker, its tool processes kept."""

    def __init__(self, engine: RolloutEngine, tokenizer, tools: ToolRunner, settings: MultiTurnSettings,
                 chat_template_kwargs: dict | None = None, interactions: dict[str, Any] | None = None) -> None:
        self.engine, self.tokenizer, self.tools, self.settings = engine, tokenizer, tools, settings
        self.parse = PARSERS[settings.format]
        self.tool_ids = ToolResponseIds(tokenizer, chat_template_kwargs)  # data.apply_chat_template_kwargs
        self.stats: dict[str, float] = {}  # the last run: engine calls, prefill tokens computed and reused
        self.interactions = interactions or {}  # name -> instance (rlcore.tools.interaction.build_interactions)
        self.events = asyncio.new_event_loop() if self.interactions else None  # where the interactions' coroutines run

    def close(self) -> None:
        """Stops the tool processes."""
        self.tools.close()

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams,
            tools_kwargs: list[dict] | None = None, interaction_kwargs: list[dict] | None = None,
            raw_prompts: list[list[dict]] | None = None) -> tuple[RolloutOutput, dict[str, Any]]:
        """Left-padded prompts `[batch, prompt_len]` -> the trajectories as a RolloutOutput (responses right-padded to
        `sampling.max_tokens`, the whole trajectory's budget, with `loss_mask`) and per-row counters `[batch]`
        (num_turns, tool_calls, tool_errors, tool_timeouts, truncated; tool_rewards, the step rewards' sum). With
        interactions, `interaction_kwargs[r]` (verl's extra_info.interaction_kwargs: `name` picks the interaction)
        and `raw_prompts[r]` (the prompt's messages, if the data keeps them) start row r's, and the counters add
        `turn_scores`: an object array of each row's list of interaction scores."""
        rows = [Trajectory(ids.tolist()) for ids in (r[m.bool()] for r, m in zip(input_ids, attention_mask))]
        self.tools.start(tools_kwargs or [{} for _ in rows])
        self.stats = dict.fromkeys(("agent/engine_calls", "agent/prefill_tokens", "agent/reused_tokens"), 0.0)
        kept: dict[int, int] | None = None  # row -> its position in the last engine call (whose KV the engine kept)
        try:
            self._start_interactions(rows, interaction_kwargs, raw_prompts)
            while live := [i for i, t in enumerate(rows) if not t.done]:
                kept = self._turn(rows, live, sampling, kept)
        finally:
            self.tools.finish()
            run_all(self.events, [t.interaction.finish() for t in rows if t.interaction is not None])
        counters: dict[str, Any] = {
            k: torch.tensor([t.stats[k] for t in rows], dtype=torch.float32 if k == "tool_rewards" else torch.long) for k in TURN_COUNTERS}
        if self.interactions:
            counters["turn_scores"] = np.empty(len(rows), dtype=object)
            counters["turn_scores"][:] = [list(t.turn_scores) for t in rows]
        return self._output(rows, input_ids.shape[1], sampling.max_tokens), counters

    def _start_interactions(self, rows: list[Trajectory], kwargs: list[dict] | None, raw_prompts: list | None) -> None:
        if not self.interactions:
            return
        for r, t in enumerate(rows):
            row_kwargs = dict((kwargs or [{}] * len(rows))[r] or {})
            name = row_kwargs.get("name")
            if name not in self.interactions:  # the data's rows were checked at load; a row built elsewhere was not
                raise ValueError(f"row {r}: interaction_kwargs.name={name!r} is not one of the configured interactions "
                                 f"({', '.join(sorted(self.interactions))}); set extra_info.interaction_kwargs.name")
            t.interaction = InteractionSession(self.interactions[name], row_kwargs)
            t.messages = [dict(m) for m in (raw_prompts[r] if raw_prompts is not None and raw_prompts[r] is not None else [])]
        run_all(self.events, [t.interaction.start() for t in rows])

    def _turn(self, rows: list[Trajectory], live: list[int], sampling: SamplingParams, kept: dict[int, int] | None) -> dict[int, int]:
        """One wave: each live row's next assistant turn, then its tool calls. Returns row -> engine row of this call."""
        budget = sampling.max_tokens
        histories = [rows[i].prompt + rows[i].ids for i in live]
        ids, mask = left_pad(histories, self.tokenizer.pad_token_id)
        turn_tokens = max(budget - len(rows[i].ids) for i in live)
        kwargs = {}
        if self.engine.keeps_kv_across_calls:
            kwargs["keep_kv"] = True
            if kept is not None:
                kwargs["prefix_of"] = [kept[i] for i in live]
        out = self.engine.generate(ids, mask, replace(sampling, max_tokens=turn_tokens), **kwargs)
        self._count_engine_call(histories)
        calls: list[ToolCall] = []
        by_row: dict[int, list[int]] = {}
        asked: list[int] = []  # rows whose interaction answers this turn
        for j, i in enumerate(live):
            t = rows[i]
            n = min(int(out.response_mask[j].sum()), budget - len(t.ids))
            if out.routed_experts is not None:
                self._keep_routes(t, out.routed_experts[j], ids.shape[1], n)
            tokens = out.responses[j, :n].tolist()
            t.append(tokens, out.response_log_probs[j, :n].tolist())
            if out.versions is not None:  # a sync between turns (or within one) makes a trajectory span versions
                start, end = out.versions[j].tolist()
                t.versions = [t.versions[0] if t.versions else start, end]
            t.stats["num_turns"] += 1
            ended = n > 0 and tokens[-1] in sampling.stop_token_ids
            parsed = self.parse(self.tokenizer.decode(tokens, skip_special_tokens=False)) if ended else []
            if t.interaction is not None:
                t.messages.append({"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=True)})
            s = self.settings
            if not ended:  # the budget ran out mid-turn
                t.done, t.stats["truncated"] = True, 1
            elif ((s.max_assistant_turns and t.stats["num_turns"] >= s.max_assistant_turns)
                  or (s.max_user_turns and t.user_turns >= s.max_user_turns)):
                t.done = True
            elif parsed:
                by_row[i] = list(range(len(calls), len(calls) + min(len(parsed), s.max_parallel_calls)))
                calls += [ToolCall(i, p.name, p.arguments, p.error) for p in parsed[: s.max_parallel_calls]]
            elif t.interaction is not None:  # no tool called: the simulated user answers (verl's INTERACTING state)
                asked.append(i)
            else:
                t.done = True
        results = self.tools.execute(calls) if calls else []
        for i, indices in by_row.items():
            self._append_responses(rows[i], [results[k] for k in indices], budget)
        answers = run_all(self.events, [rows[i].interaction.respond(rows[i].messages) for i in asked])
        for i, (stop, text, score, _) in zip(asked, answers):
            self._append_answer(rows[i], text, score, stop, budget)
        return {i: j for j, i in enumerate(live)}

    @staticmethod
    def _keep_routes(t: Trajectory, call_routes: torch.Tensor, call_width: int, n: int) -> None:
        """The routes of every position this call's samples attended to: its history (prompt and every earlier turn
        and tool response, right-aligned before `call_width`) and its `n` kept tokens but the last, which no forward
        read. The engine answers for the whole history: the native engine with the routes of the KV it kept from the
        last call, vLLM by recomputing it (a load between turns: under the new weights, as the KV itself)."""
        history = len(t.prompt) + len(t.ids)
        t.routes = call_routes[call_width - history : call_width + max(n, 1) - 1]

    def _append_responses(self, t: Trajectory, results: list[ToolResult], budget: int) -> None:
        s = self.settings
        t.stats["tool_calls"] += len(results)
        t.stats["tool_errors"] += sum(r.status == "error" for r in results)
        t.stats["tool_timeouts"] += sum(r.status == "timeout" for r in results)
        t.stats["tool_rewards"] += sum(r.reward for r in results if r.reward is not None)
        texts = [truncate_text(r.text, s.max_tool_response_length, s.tool_response_truncate_side) for r in results]
        if t.interaction is not None:
            t.messages += [{"role": "tool", "content": text} for text in texts]
        self._append_context(t, self.tool_ids(texts, self.tokenizer.decode(t.ids[-1:], skip_special_tokens=False)), budget)

    def _append_answer(self, t: Trajectory, text: str, score: float | None, stop: bool, budget: int) -> None:
        """An interaction's answer: a user message (appended even when it ends the episode, as verl does), its score."""
        if score is not None:
            t.turn_scores.append(score)
        t.messages.append({"role": "user", "content": text})
        self._append_context(t, self.tool_ids([text], self.tokenizer.decode(t.ids[-1:], skip_special_tokens=False), role="user"), budget)
        t.done = t.done or stop

    def _append_context(self, t: Trajectory, ids: list[int], budget: int) -> None:
        """Ids the policy did not sample (a tool response, a user's answer), cut to the trajectory's budget."""
        room = budget - len(t.ids)
        t.append(ids[:room])
        t.user_turns += 1
        if len(ids) >= room:  # no room left to answer: the trajectory ends inside the tool response
            t.done, t.stats["truncated"] = True, 1

    def _count_engine_call(self, histories: list[list[int]]) -> None:
        """Prefill tokens the engine computed and reused (native); an engine that does not say (vLLM, which finds
        reusable prefixes itself) counts every history token it was sent."""
        engine_stats = getattr(self.engine, "stats", {})
        self.stats["agent/engine_calls"] += 1
        self.stats["agent/prefill_tokens"] += engine_stats.get("prefill_tokens", sum(map(len, histories)))
        self.stats["agent/reused_tokens"] += engine_stats.get("reused_tokens", 0)

    def _output(self, rows: list[Trajectory], prompt_width: int, width: int) -> RolloutOutput:
        """Responses right-padded to `width`; routes laid out as the assembled batch is (prompts right-aligned
        before column `prompt_width`)."""
        pad = self.tokenizer.pad_token_id
        fill = lambda values, v: torch.tensor([x + [v] * (width - len(x)) for x in values])  # noqa: E731
        routes = None
        if rows and rows[0].routes is not None:
            routes = torch.zeros(len(rows), prompt_width + width, *rows[0].routes.shape[1:], dtype=rows[0].routes.dtype)
            for row, t in zip(routes, rows):
                start = prompt_width - len(t.prompt)
                row[start : start + len(t.routes)] = t.routes
        return RolloutOutput(
            responses=fill([t.ids for t in rows], pad),
            response_log_probs=fill([t.log_probs for t in rows], 0.0).float(),
            response_mask=fill([[1] * len(t.ids) for t in rows], 0),
            loss_mask=fill([t.sampled for t in rows], 0),
            versions=torch.tensor([t.versions for t in rows]) if all(t.versions for t in rows) else None,
            routed_experts=routes,
        )


def agent_columns(rows: dict[str, np.ndarray], interactions: bool) -> dict[str, np.ndarray]:
    """The per-row columns the agent loop reads, from a batch's non-tensor columns: verl's extra_info.tools_kwargs
    and, with interactions, extra_info.interaction_kwargs and the prompt's messages (raw_prompt, if kept)."""
    extra = rows.get("extra_info")
    if extra is None:
        return {}
    column = lambda key: np.array([(e or {}).get(key) or {} for e in extra], dtype=object)  # noqa: E731
    out = {"tools_kwargs": column("tools_kwargs")}
    if interactions:
        out["interaction_kwargs"] = column("interaction_kwargs")
        if "raw_prompt" in rows:
            out["raw_prompt"] = rows["raw_prompt"]
    return out


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`[rows, longest]` ids and attention mask, padded on the left (the engines' prompt layout)."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask
