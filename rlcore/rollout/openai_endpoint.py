"""An OpenAI-compatible endpoint that records tokens: agent programs written against the `openai` client generate
through it, and the trainer gets the exact ids they were fed and sampled.

One HTTP server per rollout worker process (127.0.0.1, a free port, started on first use) serves
`POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`. The API key names the trajectory: each
program run gets its own key, and its requests go to its `Session`, which sends them to the worker's batching server
(rlcore.rollout.agent_server) with the trainer's sampling settings (a request's `max_tokens` is honoured within the
trajectory's budget; its temperature and top_p are not: the log-probs must be the policy's).

Token-in/token-out: a session keeps the ids of its trajectory. The first call renders the messages (and `tools`)
with the model's chat template; each later call must repeat the conversation so far and the assistant message it
was given, then add tool or user messages: only those are rendered (as the tool agent renders tool responses,
rlcore.rollout.agent_loop.ToolResponseIds) and appended after the sampled ids, which are never re-tokenized. A call
whose history differs from what was recorded (an edited, dropped or invented turn) is counted as a rewrite: the
recording keeps its ids up to where the new rendering departs from them, and the rest of the rendering follows as
context (mask 0: the re-tokenized text is never trained on); only a change inside the prompt itself starts the
trajectory over from the new prompt. Tool calls are parsed from the
sampled text as the tool agent parses them (hermes `<tool_call>{json}</tool_call>`) and returned as OpenAI
`tool_calls`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from rlcore.rollout.agent_loop import ToolResponseIds
from rlcore.tools.parser import ParsedCall


class Session:
    """One trajectory's recording: the segment's prompt ids, then every id after it (sampled: 1, appended: 0)."""

    def __init__(self, server: Any, loop: asyncio.AbstractEventLoop, tokenizer, render: ToolResponseIds,
                 parse: Callable[[str], list[ParsedCall]], budget: int, sampling_params: dict[str, Any]) -> None:
        self.server, self.loop, self.tokenizer, self.render, self.parse = server, loop, tokenizer, render, parse
        self.budget, self.params = budget, dict(sampling_params)
        self.key = uuid.uuid4().hex
        self.prompt: list[int] = []
        self.response: list[int] = []
        self.sampled: list[int] = []
        self.log_probs: list[float] = []
        self.history: list[dict] | None = None  # the conversation as the last chat call sent it, plus our reply
        self.text: str | None = None  # /v1/completions: the prompt and completion text so far
        self.calls, self.rewrites = 0, 0
        self.engine_wait_s = 0.0  # time its calls waited for the engine: not the program's own time (its timeout)

    # ------------------------------------------------------------------------------------------ chat
    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [_plain(m) for m in body.get("messages") or []]
        if not messages:
            raise ValueError("messages is empty")
        if self.history is not None and _continues(messages, self.history):
            new = messages[len(self.history):]
            self._append(self.render.continuation(new, self._stop_text()))
        else:
            self._restart(_ids(self.tokenizer.apply_chat_template(
                messages, tools=body.get("tools"), tokenize=True, add_generation_prompt=True, **self.render.kwargs)))
        tokens, finish = await self._generate(body)
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        calls = self.parse(text) if finish == "stop" else []
        content = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if calls:
            content = content[: content.find("<tool_call>")] if "<tool_call>" in content else content
        reply: dict[str, Any] = {"role": "assistant", "content": content.strip()}
        if calls:
            reply["tool_calls"] = [{"id": f"call_{self.calls}_{i}", "type": "function",
                                    "function": {"name": c.name or "", "arguments": json.dumps(c.arguments or {})}}
                                   for i, c in enumerate(calls)]
            finish = "tool_calls"
        self.history = [*messages, _plain(reply)]
        return {"id": f"chatcmpl-{self.key}-{self.calls}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "policy"),
                "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
                "usage": self._usage(tokens)}

    # ------------------------------------------------------------------------------------------ completions
    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("prompt must be one string")
        if self.text is not None and prompt.startswith(self.text):
            self._append(self.tokenizer.encode(prompt[len(self.text):], add_special_tokens=False))
        else:
            self._restart(self.tokenizer.encode(prompt, add_special_tokens=False))
        tokens, finish = await self._generate(body)
        completion = self.tokenizer.decode(tokens, skip_special_tokens=False)
        self.text = prompt + completion
        return {"id": f"cmpl-{self.key}-{self.calls}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", "policy"),
                "choices": [{"index": 0, "text": completion, "finish_reason": finish, "logprobs": None}],
                "usage": self._usage(tokens)}

    # ------------------------------------------------------------------------------------------ shared
    async def _generate(self, body: dict[str, Any]) -> tuple[list[int], str]:
        room = self.budget - len(self.response)
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or room
        self.calls += 1
        if min(int(asked), room) <= 0:
            return [], "length"
        start = time.monotonic()
        try:
            out = await self.server.generate(self.key, prompt_ids=self.prompt + self.response,
                                             sampling_params={**self.params, "max_tokens": min(int(asked), room)})
        finally:
            self.engine_wait_s += time.monotonic() - start
        self.response += out.token_ids
        self.sampled += [1] * len(out.token_ids)
        self.log_probs += out.log_probs
        return out.token_ids, "stop" if out.stop_reason == "completed" else "length"

    def _append(self, ids: list[int]) -> None:
        """Ids the policy did not sample (tool or user messages and the template's glue), cut to the budget."""
        ids = ids[: max(0, self.budget - len(self.response))]
        self.response += ids
        self.sampled += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)

    def _restart(self, ids: list[int]) -> None:
        """A call that does not continue the recording (the first one, or a rewrite): `ids` is its rendering."""
        self.history, self.text = None, None
        if not self.prompt:
            self.prompt = ids
            return
        self.rewrites += 1
        recorded = self.prompt + self.response
        same = next((i for i, (a, b) in enumerate(zip(recorded, ids)) if a != b), min(len(recorded), len(ids)))
        if same < len(self.prompt):  # the prompt itself changed: the trajectory starts over
            self.prompt, self.response, self.sampled, self.log_probs = ids, [], [], []
            return
        keep = same - len(self.prompt)
        self.response, self.sampled, self.log_probs = self.response[:keep], self.sampled[:keep], self.log_probs[:keep]
        self._append(ids[same:])

    def _stop_text(self) -> str:
        last = [t for t, s in zip(self.response, self.sampled) if s][-1:]
        return self.tokenizer.decode(last, skip_special_tokens=False)

    def _usage(self, tokens: list[int]) -> dict[str, int]:
        fed = len(self.prompt) + len(self.response) - len(tokens)
        return {"prompt_tokens": fed, "completion_tokens": len(tokens), "total_tokens": fed + len(tokens)}


def _ids(rendered: Any) -> list[int]:
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat template and the comparison read it: role, content ("" for none), tool calls by name
    and parsed arguments; a tool result keeps its tool_call_id and name."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"], "arguments": _json(c["function"]["arguments"])}}
                             for c in message["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def _json(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def _continues(messages: list[dict], history: list[dict]) -> bool:
    """The call repeats the recorded conversation and our last reply, then adds only tool or user messages."""
    same = lambda a, b: {k: a.get(k) for k in ("role", "content", "tool_calls")} == {k: b.get(k) for k in ("role", "content", "tool_calls")}  # noqa: E731
    return (len(messages) > len(history) and all(same(m, h) for m, h in zip(messages, history))
            and all(m["role"] in ("tool", "user") for m in messages[len(history):]))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every program of a step connects at once (the default backlog, 5, refuses them)


class Endpoint:
    """The process's HTTP server; sessions are registered by key for the length of one program run."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self.httpd.serve_forever, name="rlcore-openai-endpoint", daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def open(self, session: Session) -> str:
        with self.lock:
            self.sessions[session.key] = session
        return session.key

    def close(self, key: str) -> None:
        with self.lock:
            self.sessions.pop(key, None)

    def session(self, key: str) -> Session | None:
        with self.lock:
            return self.sessions.get(key)


_ENDPOINT: Endpoint | None = None
_ENDPOINT_LOCK = threading.Lock()


def endpoint() -> Endpoint:
    """The process's endpoint, started on first use."""
    global _ENDPOINT
    with _ENDPOINT_LOCK:
        if _ENDPOINT is None:
            _ENDPOINT = Endpoint()
        return _ENDPOINT


def _handler(owner: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            if self.path.rstrip("/").endswith("/models"):
                return self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "rlcore"}]})
            self._send(404, _error(f"no route {self.path}"))

        def do_POST(self) -> None:  # noqa: N802
            # The body is read before any answer: left unread, it would be parsed as the connection's next request.
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            route = self.path.rstrip("/")
            method = "chat" if route.endswith("/chat/completions") else "complete" if route.endswith("/completions") else None
            if method is None:
                return self._send(404, _error(f"no route {self.path}; this endpoint serves /v1/chat/completions and /v1/completions"))
            key = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            session = owner.session(key)
            if session is None:
                return self._send(401, _error("unknown or finished trajectory: the API key is the one the program was started with, "
                                              "valid until the program returns or times out"))
            try:
                body = json.loads(raw or b"{}")
                if body.get("stream"):
                    raise ValueError("stream=true is not supported; call without streaming")
                if body.get("n", 1) != 1:
                    raise ValueError("n != 1 is not supported: one call samples one continuation of its trajectory")
                reply = asyncio.run_coroutine_threadsafe(getattr(session, method)(body), session.loop).result()
            except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
                return self._send(400, _error(f"{type(err).__name__}: {err}"))
            except Exception as err:  # noqa: BLE001 -- the engine failed; the program sees a server error
                return self._send(500, _error(f"{type(err).__name__}: {err}"))
            self._send(200, reply)

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- http.server's signature
            pass  # one line per call would flood the worker's log

    return Handler


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}
