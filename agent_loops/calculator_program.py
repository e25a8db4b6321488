"""A calculator agent written as any agent is, against the OpenAI client (no rlcore import): it offers an `add`
tool, runs the calls the model makes and feeds the results back, until the model answers without one.

rlcore trains it through its recording endpoint (agent_loops/calculator.yaml, docs/multi-turn.md): called once per
prompt as run(base_url, api_key, **row); returning None lets the task's scorer grade the final answer.
"""

import json

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers and return their sum.",
    "parameters": {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer", "description": "first addend"}, "b": {"type": "integer", "description": "second addend"}}}}}]


def add(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        a, b = args["a"], args["b"]
    except (ValueError, KeyError, TypeError) as err:
        return f"error: {err}"
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
        return f"error: add takes integers a and b, got {a!r} and {b!r}"
    return str(a + b)


def run(base_url: str, api_key: str, raw_prompt, max_turns: int = 4, **row):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [dict(m) for m in raw_prompt]
    for _ in range(max_turns):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(call.function.arguments)})
    return None
