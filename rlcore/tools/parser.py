"""Hermes tool calls, the format of Qwen2.5 / Qwen3 chat templates: the model writes each call as

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 * 7"}}
    </tool_call>

`parse_hermes` returns one ParsedCall per block, in order. A block that cannot be run becomes a ParsedCall with
`error` set: the agent loop shows that short message to the model as the tool's output, so it can correct itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedCall:
    """One tool call: name and arguments, or (for a malformed block) `error`, the text the model sees instead."""

    name: str | None
    arguments: dict | None
    error: str | None = None


def parse_hermes(text: str) -> list[ParsedCall]:
    """Every `<tool_call>...</tool_call>` block of `text`; a `<tool_call>` never closed is an error call."""
    calls, pos = [], 0
    while (start := text.find(OPEN, pos)) != -1:
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:  # often a response cut at max length mid-call
            calls.append(ParsedCall(None, None, f"error: {OPEN} is not closed with {CLOSE}"))
            break
        calls.append(_parse_block(text[start + len(OPEN):end]))
        pos = end + len(CLOSE)
    return calls


def _parse_block(body: str) -> ParsedCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return ParsedCall(None, None, f"error: tool call is not valid JSON: {err}")
    if not isinstance(call, dict):
        return ParsedCall(None, None, 'error: tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(None, None, 'error: tool call has no "name" (a string)')
    arguments = call.get("arguments", {})  # a tool without parameters may be called without them
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as in OpenAI's API
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return ParsedCall(name, None, f"error: arguments of tool {name} are not valid JSON: {err}")
    if not isinstance(arguments, dict):
        return ParsedCall(name, None, f'error: "arguments" of tool {name} must be a JSON object, got {type(arguments).__name__}')
    return ParsedCall(name, arguments)
