"""Agent programs through the recording OpenAI-compatible endpoint: the unmodified `openai` client talks to it, the
trajectory is exactly the ids fed and sampled (the training forward's log-probs match), tool calls come back
parsed, a rewritten history starts a counted segment, and a crashing or hanging program costs its row only."""

from __future__ import annotations

import json
import sys
import time

import httpx
import numpy as np
import pytest
import torch
from openai import OpenAI

from rlcore.config import compose
from rlcore.config.agent_loop_config import AgentLoopSpec
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.rollout.agent_loop import ToolResponseIds, left_pad
from rlcore.rollout.agent_program import AgentProgramLoop
from rlcore.rollout.agent_runner import AgentRunner
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout
from rlcore.rollout.openai_endpoint import endpoint

SEEN: dict[int, list] = {}  # row index -> the replies the program got


def two_calls(base_url, api_key, raw_prompt, index, **row):
    """Any agent: asks, then says "again" as the user and asks once more; grades nothing (returns None)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(raw_prompt)
    for _ in range(2):
        message = client.chat.completions.create(model="policy", messages=messages, max_tokens=6).choices[0].message
        SEEN.setdefault(int(index), []).append(message)
        messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]


def calculator(base_url, api_key, raw_prompt, index, **row):
    """A tool-using agent: runs the model's add calls, feeds results back; rewrites its history on row 1; returns
    its own reward."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(raw_prompt)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    while True:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=tools).choices[0]
        SEEN.setdefault(int(index), []).append(reply)
        if not reply.message.tool_calls:
            return 1.0 if reply.message.content == "3" else 0.0
        message = reply.message.model_dump(exclude_none=True)
        if index == 1:
            message["content"] = "let me add"  # a rewritten turn: the recording starts over
        messages.append(message)
        for call in reply.message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})


def crash_or_hang(base_url, api_key, raw_prompt, index, **row):
    if index == 0:
        raise RuntimeError("agent bug")
    if index == 1:
        time.sleep(3)  # past timeout_s=0.5: abandoned, its row scored failure_score
    return calculator(base_url, api_key, raw_prompt, index, **row)


class Scripted(RolloutEngine):
    """A turn calls add(1, 2); after a tool result it answers "3"."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, input_ids, attention_mask, sampling):
        ids = []
        for row, mask in zip(input_ids, attention_mask):
            text = "3" if "<tool_response>" in self.tokenizer.decode(row[mask.bool()].tolist()) else \
                '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'
            ids.append(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id])
        pad = lambda xs, v: torch.tensor([x + [v] * (sampling.max_tokens - len(x)) for x in xs])  # noqa: E731
        return RolloutOutput(pad(ids, 0), pad([[-0.25] * len(i) for i in ids], 0.0), pad([[1] * len(i) for i in ids], 0))

    def update_weights(self, weights):
        pass


def runner(engine, tokenizer, program: str | None, **kwargs) -> AgentRunner:
    target = {"program": f"{__name__}:{program}"} if program else {}
    spec = AgentLoopSpec("prog", "rlcore.rollout.agent_program.AgentProgramLoop", {"name": "prog", **target, **kwargs})
    return AgentRunner(engine, tokenizer, compose(["recipe=tiny_cpu", "data.max_response_length=120"]), [spec], "prog", None, prompt_width=12)


def batch(tokenizer, problems: list[str]):
    chats = [[{"role": "user", "content": p}] for p in problems]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in chats]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered], tokenizer.pad_token_id)
    raw = np.empty(len(chats), dtype=object)
    raw[:] = chats
    return ids, mask, {"raw_prompt": raw, "index": np.arange(len(chats))}


def test_a_programs_trajectory_is_the_ids_it_was_fed_and_sampled_with_the_policys_log_probs(tiny_model_dir):
    tokenizer = build_char_tokenizer()
    model = load_causal_lm(tiny_model_dir, None, dtype=torch.float32)
    engine = NativeRollout(tiny_model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0)
    engine.update_weights(model.named_parameters())
    SEEN.clear()
    ids, mask, rows = batch(tokenizer, ["12+34=", "5+6=", "7+8=", "1+1="])
    run = runner(engine, tokenizer, "two_calls")
    prompts, prompt_mask, out, counters = run.generate_batch(ids, mask, SamplingParams(max_tokens=120, stop_token_ids=[tokenizer.eos_token_id]), rows)
    assert run.stats["agent/metrics/calls"] == 2 and run.stats["agent/requests"] == 8 and run.stats["agent/engine_calls"] == 2
    render = ToolResponseIds(tokenizer)
    for r in range(4):  # sampled, then "again" as the template renders a user turn (mask 0), then sampled
        n = int(out.response_mask[r].sum())
        tokens, is_sampled = out.responses[r, :n].tolist(), out.loss_mask[r, :n].tolist()
        k1 = is_sampled.index(0)
        k2 = n - (k1 + is_sampled[k1:].index(1))
        user = render.continuation([{"role": "user", "content": "again"}], tokenizer.decode(tokens[k1 - 1: k1], skip_special_tokens=False))
        assert tokens[k1: n - k2] == user and is_sampled == [1] * k1 + [0] * len(user) + [1] * k2 and k1 <= 6 and k2 <= 6
        replies = [tokenizer.decode(part, skip_special_tokens=True).strip() for part in (tokens[:k1], tokens[n - k2:])]
        assert replies == [m.content for m in SEEN[r]]  # what the program read is what was sampled
    batch_ = assemble_sequences(prompts, prompt_mask, out)
    with torch.no_grad():
        logits = model(input_ids=batch_["input_ids"], attention_mask=batch_["attention_mask"], position_ids=batch_["position_ids"]).logits
    width = prompts.shape[1]
    lp = logits[:, width - 1:-1].log_softmax(-1).gather(-1, out.responses[..., None]).squeeze(-1)
    sampled = batch_["response_mask"].bool()
    torch.testing.assert_close(lp[sampled], batch_["rollout_log_probs"][sampled], atol=1e-5, rtol=0)
    assert counters["agent_reward"].isnan().all()  # it returned None: compute_score grades the trajectory


def test_tool_calls_come_back_parsed_and_a_rewritten_history_is_counted_and_kept_as_context():
    tokenizer = build_char_tokenizer()
    SEEN.clear()
    ids, mask, rows = batch(tokenizer, ["1+2=", "1+2="])
    run = runner(Scripted(tokenizer), tokenizer, "calculator")
    _, _, out, counters = run.generate_batch(ids, mask, SamplingParams(max_tokens=120, stop_token_ids=[tokenizer.eos_token_id]), rows)
    call = SEEN[0][0]
    assert call.finish_reason == "tool_calls" and call.message.content == ""
    assert (call.message.tool_calls[0].function.name, json.loads(call.message.tool_calls[0].function.arguments)) == ("add", {"a": 1, "b": 2})
    assert SEEN[0][1].finish_reason == "stop" and SEEN[0][1].message.content == "3"
    assert counters["agent_reward"].tolist() == [1.0, 1.0] and run.stats["agent/metrics/history_rewrites"] == 0.5
    sampled = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call><|endoftext|>'
    tool_turn = tokenizer.decode(ToolResponseIds(tokenizer)(["3"], "<|endoftext|>"), skip_special_tokens=False)
    text = lambda r: tokenizer.decode(out.responses[r, : int(out.response_mask[r].sum())].tolist(), skip_special_tokens=False)  # noqa: E731
    assert text(0) == sampled + tool_turn + "3<|endoftext|>"  # the sampled ids, the tool result appended, never re-rendered
    # Row 1 rewrote its turn: its sampled call is dropped where the history departs, the rewritten turn is context.
    rewritten = "let me add<|endoftext|>" + tool_turn
    assert text(1) == rewritten + "3<|endoftext|>" and out.loss_mask[1].sum() == 2


def test_a_crashing_or_hanging_program_costs_its_row_only():
    tokenizer = build_char_tokenizer()
    ids, mask, rows = batch(tokenizer, ["1+2=", "1+2=", "1+2="])
    run = runner(Scripted(tokenizer), tokenizer, "crash_or_hang", timeout_s=0.5, failure_score=-1.0)
    start = time.monotonic()
    _, _, out, counters = run.generate_batch(ids, mask, SamplingParams(max_tokens=120, stop_token_ids=[tokenizer.eos_token_id]), rows)
    assert time.monotonic() - start < 2.5  # the hung program was not waited for
    assert counters["agent_reward"].tolist() == [-1.0, -1.0, 1.0]
    assert run.stats["agent/metrics/program_error"] == run.stats["agent/metrics/program_timeout"] == pytest.approx(1 / 3)
    assert out.response_mask[:2].sum() == 0 and out.response_mask[2].sum() > 0


def test_the_endpoint_refuses_unknown_keys_and_what_it_does_not_serve():
    base = endpoint().base_url
    assert httpx.get(f"{base}/models").json()["data"][0]["id"] == "policy"
    refused = httpx.post(f"{base}/chat/completions", headers={"Authorization": "Bearer nobody"}, json={"messages": []})
    assert refused.status_code == 401 and "unknown or finished trajectory" in refused.json()["error"]["message"]
    problems = AgentProgramLoop.check_config({"program": "no_such_module:run", "timeout_s": 0, "retries": 2})
    assert len(problems) == 3 and "timeout_s=0 must be > 0" in problems[1] and "unknown arguments ['retries']" in problems[2]


AGENT_PROCESS = '''
import json, os, sys, time
from openai import OpenAI
row = json.load(sys.stdin)
if row["index"] == 1:
    time.sleep(60)  # hangs: killed at timeout_s
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
reply = client.chat.completions.create(model="policy", messages=row["raw_prompt"], max_tokens=4).choices[0].message
print(json.dumps(len(reply.content) / 10))
'''


def test_an_agent_process_reads_the_endpoint_from_its_environment_and_a_hung_one_is_killed(tmp_path):
    import psutil

    script = tmp_path / "agent.py"
    script.write_text(AGENT_PROCESS)
    tokenizer = build_char_tokenizer()
    ids, mask, rows = batch(tokenizer, ["1+2=", "3+4="])
    run = runner(Scripted(tokenizer), tokenizer, None, command=[sys.executable, str(script)], timeout_s=5)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    _, _, out, counters = run.generate_batch(ids, mask, SamplingParams(max_tokens=120, stop_token_ids=[tokenizer.eos_token_id]), rows)
    assert counters["agent_reward"][0].item() == pytest.approx(0.4) and counters["agent_reward"][1] == 0.0  # 4 tokens; killed
    assert run.stats["agent/metrics/program_timeout"] == 0.5 and out.loss_mask[0].sum() == 4
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # the hung process is gone
