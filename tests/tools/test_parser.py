"""Hermes tool-call parsing: every block in order, and a malformed block becomes an error the model is shown."""

import pytest

from rlcore.tools.parser import ParsedCall, parse_hermes


def test_blocks_in_order_with_whitespace_and_string_arguments():
    text = ('Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"3*7\\"}"}</tool_call> done')
    assert parse_hermes(text) == [ParsedCall("add", {"a": 1, "b": 2}), ParsedCall("calculator", {"expression": "3*7"})]


def test_no_calls_and_calls_without_arguments():
    assert parse_hermes("The answer is 42.") == []
    assert parse_hermes('<tool_call>{"name": "now"}</tool_call>') == [ParsedCall("now", {})]


@pytest.mark.parametrize("block, call", [
    ('{"name": "add", "arguments": {"a": 1,}}', ParsedCall(None, None, "error: tool call is not valid JSON: Expecting property name")),
    ('["add"]', ParsedCall(None, None, 'error: tool call must be a JSON object {"name": ..., "arguments": {...}}')),
    ('{"arguments": {}}', ParsedCall(None, None, 'error: tool call has no "name" (a string)')),
    ('{"name": 3, "arguments": {}}', ParsedCall(None, None, 'error: tool call has no "name" (a string)')),
    ('{"name": "add", "arguments": [1, 2]}', ParsedCall("add", None, 'error: "arguments" of tool add must be a JSON object, got list')),
    ('{"name": "add", "arguments": "a=1"}', ParsedCall("add", None, "error: arguments of tool add are not valid JSON: Expecting value")),
])
def test_a_bad_block_is_an_error_call_and_the_others_still_parse(block, call):
    first, second = parse_hermes(f'<tool_call>{block}</tool_call><tool_call>{{"name": "add", "arguments": {{}}}}</tool_call>')
    assert (first.name, first.arguments) == (call.name, call.arguments) and first.error.startswith(call.error), first
    assert second == ParsedCall("add", {})


def test_an_unclosed_block_is_an_error():
    calls = parse_hermes('<tool_call>{"name": "add", "arguments": {}}</tool_call> <tool_call>{"name": "add", "argu')
    assert calls == [ParsedCall("add", {}), ParsedCall(None, None, "error: <tool_call> is not closed with </tool_call>")]
