"""The multi-turn agent loop: token-in/token-out trajectories, the sampled-token mask, tool turns and budgets, and
the native engine's KV kept across turns."""

from __future__ import annotations

import re
import time

import pytest
import torch

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.models.random_init import build_model_dir
from rlcore.models.router import ROUTES, Routing, to_routes
from rlcore.rollout import agent_loop
from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings, ToolResponseIds, left_pad, truncate_text
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout
from rlcore.tools.parser import ParsedCall
from rlcore.tools.runner import ToolResult


class EchoTools:
    """A stand-in ToolRunner: answers every call with `r<trajectory>:<n>` (n counts the calls), records them."""

    def __init__(self) -> None:
        self.calls, self.started, self.finished = [], None, 0

    def start(self, tools_kwargs):
        self.started = tools_kwargs

    def execute(self, calls):
        self.calls += calls
        return [ToolResult(f"r{c.trajectory}:{len(self.calls)}", None, {}, "ok") for c in calls]

    def finish(self):
        self.finished += 1


@pytest.fixture
def every_turn_calls(monkeypatch):
    """A tool-call format under which every finished turn is one call: a random model then makes multi-turn
    trajectories with tool responses in the middle, which is what the equality below needs."""
    monkeypatch.setitem(agent_loop.PARSERS, "every_turn", lambda text: [ParsedCall("echo", {"text": text}, None)])


def prompts(tokenizer, problems, n: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True) for p in problems]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rows], tokenizer.pad_token_id)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)


def native(model_dir: str, tokenizer, model) -> NativeRollout:
    engine = NativeRollout(model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0)
    engine.update_weights(model.named_parameters())
    return engine


def stop_ids(tokenizer) -> list[int]:
    """EOS and the ten digits: a random model then ends a turn every ~10 tokens (EOS alone: every ~100)."""
    return [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list("0123456789"))]


def run(engine, tokenizer, tools, settings, max_tokens=128, problems=("12+34=", "5+67=", "99+1="), n=2):
    ids, mask = prompts(tokenizer, problems, n)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, stop_token_ids=stop_ids(tokenizer), seed=5)
    out, counters = AgentLoop(engine, tokenizer, tools, settings).run(ids, mask, sampling)
    return ids, mask, out, counters


@pytest.mark.numerics
def test_sampled_tokens_carry_the_training_forwards_log_probs(tiny_model_dir, every_turn_calls):
    """Multi-turn trajectories (tool responses between turns): on every sampled token the rollout's log-prob equals
    the training forward's over the assembled sequence (fp32, 1e-5); tool ids and glue are context, mask 0."""
    tokenizer = build_char_tokenizer()
    model = load_causal_lm(tiny_model_dir, None, dtype=torch.float32)
    tools = EchoTools()
    ids, mask, out, counters = run(native(tiny_model_dir, tokenizer, model), tokenizer, tools, MultiTurnSettings(format="every_turn"))
    batch = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
    prompt_len, width = ids.shape[1], out.responses.shape[1]
    log_probs = logits[:, prompt_len - 1 : prompt_len + width - 1].float().log_softmax(-1)
    log_probs = log_probs.gather(-1, out.responses[..., None]).squeeze(-1)
    sampled = batch["response_mask"].bool()
    assert counters["num_turns"].float().mean() > 2 and len(tools.calls) >= 6  # tool turns between sampled ones
    torch.testing.assert_close(log_probs[sampled], batch["rollout_log_probs"][sampled], atol=1e-5, rtol=0)
    assert (batch["rollout_log_probs"][~sampled] == 0).all()
    # Every tool turn appended exactly what the template renders for the tool's text (mask 0), after a sampled EOS.
    render = ToolResponseIds(tokenizer)
    for row in range(len(ids)):
        real = int(out.response_mask[row].sum())
        tokens, is_sampled = out.responses[row, :real].tolist(), out.loss_mask[row, :real].tolist()
        spans = [i for i in range(1, real) if not is_sampled[i] and is_sampled[i - 1]]  # where each tool turn starts
        assert spans and all(tokens[i - 1] in stop_ids(tokenizer) for i in spans)
        for i in spans:
            length = next((j for j in range(i, real) if is_sampled[j]), real) - i
            text = tokenizer.decode(tokens[i : i + length])
            stop_text = tokenizer.decode(tokens[i - 1 : i], skip_special_tokens=False)
            response = re.search("<tool_response>(.*)</tool_response>", text)
            expected = render([response.group(1)], stop_text) if response else None
            assert expected is None or tokens[i : i + length] == expected  # None: cut off by the budget
    assert out.response_mask.sum(-1).max() <= 128 and counters["truncated"].sum() >= 1


def test_kept_kv_gives_the_same_trajectories_and_prefills_only_what_turns_appended(tiny_model_dir, every_turn_calls):
    tokenizer = build_char_tokenizer()
    model = load_causal_lm(tiny_model_dir, None, dtype=torch.float32)
    results = {}
    for keep in (True, False):
        engine = native(tiny_model_dir, tokenizer, model)
        engine.keeps_kv_across_calls = keep
        _, _, out, counters = run(engine, tokenizer, EchoTools(), MultiTurnSettings(format="every_turn"))
        results[keep] = out, dict(engine.stats)
    (kept, kept_stats), (full, full_stats) = results[True], results[False]
    assert torch.equal(kept.responses, full.responses) and torch.equal(kept.loss_mask, full.loss_mask)
    torch.testing.assert_close(kept.response_log_probs, full.response_log_probs, atol=1e-5, rtol=0)
    assert kept_stats["reused_tokens"] > 0 and full_stats["reused_tokens"] == 0
    assert kept_stats["prefill_tokens"] + kept_stats["reused_tokens"] == full_stats["prefill_tokens"]


@pytest.mark.numerics
@pytest.mark.parametrize("keep_kv", [True, False])
def test_a_mixture_of_experts_routes_of_every_turn_and_tool_response_are_recorded(tmp_path, every_turn_calls, keep_kv):
    """R3 across turns: the trajectories' routes are those of HF's forward over the assembled sequences at every token
    that decides a log-prob, sampled and tool ids alike (a trajectory's final tool response, which no forward read, has
    none). keep_kv: each turn prefills only what it appended, so the
    earlier positions' routes come from earlier calls; without it every call recomputes the history (as vLLM does)."""
    tokenizer = build_char_tokenizer()
    model_dir = build_model_dir(str(tmp_path / "moe"), "tiny-qwen3-moe", tokenizer)
    model = load_causal_lm(model_dir, None, dtype=torch.float32)
    engine = NativeRollout(model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0, record_routes=True)
    engine.update_weights(model.named_parameters())
    engine.keeps_kv_across_calls = keep_kv
    ids, mask, out, counters = run(engine, tokenizer, EchoTools(), MultiTurnSettings(format="every_turn"))
    batch = assemble_sequences(ids, mask, out)
    routing = Routing(model)
    with torch.no_grad(), routing.run(record=True) as p:
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])
    hf = to_routes(p.recorded, routing.num_layers).view(*batch["input_ids"].shape, routing.num_layers, routing.top_k)
    # A position decides a log-prob up to the last sampled token; a tool response that ends a trajectory feeds nothing.
    last_sampled = ids.shape[1] + out.loss_mask.shape[1] - 1 - out.loss_mask.flip(-1).argmax(-1)
    decides = batch["attention_mask"].bool() & (torch.arange(batch["input_ids"].shape[1]) < last_sampled[:, None])
    assert counters["num_turns"].float().mean() > 2 and (engine.stats["reused_tokens"] > 0) == keep_kv
    assert batch[ROUTES].shape == (*batch["input_ids"].shape, 2, 2)
    assert torch.equal(batch[ROUTES][decides], hf[decides])


class ScriptedEngine(RolloutEngine):
    """Generates given texts: row r's k-th turn is `turns[r][k]` + EOS (log-prob -1 per token)."""

    def __init__(self, tokenizer, turns: list[list[str]]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0
        self.rows: list[int] = []  # which trajectory each row of the next call is: the loop keeps the live ones in order

    def generate(self, input_ids, attention_mask, sampling):
        if not self.rows:
            self.rows = list(range(len(input_ids)))
        texts = [self.turns[r][self.calls] if self.calls < len(self.turns[r]) else "" for r in self.rows]
        self.calls += 1
        ids = [self.tokenizer.encode(t, add_special_tokens=False)[: sampling.max_tokens] for t in texts]
        ids = [i + [self.tokenizer.eos_token_id] if len(i) < sampling.max_tokens else i for i in ids]
        width = sampling.max_tokens
        pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs])  # noqa: E731
        return RolloutOutput(pad(ids, 0), pad([[-1.0] * len(i) for i in ids], 0.0), pad([[1] * len(i) for i in ids], 0))

    def update_weights(self, weights):
        pass


def test_budget_turn_caps_and_parallel_calls(every_turn_calls):
    tokenizer = build_char_tokenizer()
    tools = EchoTools()
    engine = ScriptedEngine(tokenizer, [["a", "b", "c", "d"]])
    ids, mask = prompts(tokenizer, ["1+1="])
    sampling = SamplingParams(max_tokens=200, stop_token_ids=[tokenizer.eos_token_id])
    loop = AgentLoop(engine, tokenizer, tools, MultiTurnSettings(format="every_turn", max_assistant_turns=3))
    out, counters = loop.run(ids, mask, sampling, tools_kwargs=[{"echo": {"create_kwargs": {"x": 1}}}])
    assert counters["num_turns"].tolist() == [3] and counters["tool_calls"].tolist() == [2]  # the third turn's call is not run
    assert tools.started == [{"echo": {"create_kwargs": {"x": 1}}}] and tools.finished == 1
    text = tokenizer.decode(out.responses[0, : int(out.response_mask[0].sum())], skip_special_tokens=False)
    assert text == ("a<|endoftext|><|user|><tool_response>r0:1</tool_response><|assistant|>b<|endoftext|>"
                    "<|user|><tool_response>r0:2</tool_response><|assistant|>c<|endoftext|>")
    assert out.loss_mask[0].sum() == 6 and not counters["truncated"].any()  # a, b, c and their three EOS
    # The budget: 40 tokens end inside the second tool response; the trajectory is marked truncated.
    engine.calls, engine.rows = 0, []
    loop.settings = MultiTurnSettings(format="every_turn", max_user_turns=5)
    out, counters = loop.run(ids, mask, SamplingParams(max_tokens=40, stop_token_ids=[tokenizer.eos_token_id]))
    assert int(out.response_mask.sum()) == 40 and counters["truncated"].tolist() == [1]


def test_tool_responses_are_truncated_by_characters_on_the_configured_side():
    assert truncate_text("abcdefghij", 20, "middle") == "abcdefghij"
    assert truncate_text("abcdefghij", 4, "left") == "abcd...(truncated)..."
    assert truncate_text("abcdefghij", 4, "right") == "...(truncated)...ghij"
    assert truncate_text("abcdefghij", 4, "middle") == "ab...(truncated)...ij"


def test_tool_response_ids_are_the_templates_tool_turn_and_generation_prompt():
    tokenizer = build_char_tokenizer()
    render = ToolResponseIds(tokenizer)
    assert tokenizer.decode(render(["579", "8"], "<|endoftext|>"), skip_special_tokens=False) == \
        "<|user|><tool_response>579</tool_response><|user|><tool_response>8</tool_response><|assistant|>"
    # A turn ended by another stop token still gets the template's end of turn before the tool message.
    assert tokenizer.decode(render(["1"], "<|pad|>"), skip_special_tokens=False) == \
        "<|endoftext|><|user|><tool_response>1</tool_response><|assistant|>"


def test_hermes_calls_run_in_tool_processes_and_failures_come_back_as_text(tmp_path):
    """The real runner: an add call answers with the sum, a raising tool and a hanging one (killed after
    tool_timeout_s) answer with their error as the tool's text and are counted; the step neither fails nor hangs."""
    from rlcore.config.tool_config import ToolSpec
    from rlcore.tools.builtin import AddTool
    from rlcore.tools.runner import ToolRunner
    from rlcore.tools.testing import schema

    specs = [ToolSpec("rlcore.tools.builtin.AddTool", {}, AddTool.TOOL_SCHEMA), ToolSpec("rlcore.tools.testing.RaisingTool", {}, schema("boom")),
             ToolSpec("rlcore.tools.testing.SleepingTool", {}, schema("hang")), ToolSpec("rlcore.tools.testing.CounterTool", {}, schema("count"))]
    call = lambda name, args: '<tool_call>{"name":"%s","arguments":%s}</tool_call>' % (name, args)  # noqa: E731
    tokenizer = build_char_tokenizer()
    engine = ScriptedEngine(tokenizer, [[call("add", '{"a":123,"b":456}') + call("add", '{"a":1,"b":2}'), "579"],
                                        [call("boom", "{}"), "?"], [call("hang", '{"seconds":60}'), "?"], ["<tool_call>{not json</tool_call>", "!"],
                                        [call("count", "{}"), call("count", "{}"), "done"]])
    ids, mask = prompts(tokenizer, ["a", "b", "c", "d", "e"])
    tools_kwargs = [{}, {}, {}, {}, {"count": {"create_kwargs": {"start": 10}}}]  # verl's extra_info.tools_kwargs
    with ToolRunner(specs, num_workers=2, timeout_s=1.0) as tools:
        loop = AgentLoop(engine, tokenizer, tools, MultiTurnSettings(max_parallel_calls=1))
        began = time.perf_counter()
        out, counters = loop.run(ids, mask, SamplingParams(max_tokens=200, stop_token_ids=[tokenizer.eos_token_id]), tools_kwargs)
        seconds = time.perf_counter() - began
    texts = [tokenizer.decode(out.responses[r, : int(out.response_mask[r].sum())]) for r in range(5)]
    assert "<tool_response>579</tool_response><|assistant|>579" in texts[0] and "<tool_response>3<" not in texts[0]  # max_parallel_calls=1
    assert "<tool_response>error: " in texts[1] and "error: tool hang timed out" in texts[2] and "<tool_response>error: " in texts[3]
    assert counters["tool_calls"].tolist() == [1, 1, 1, 1, 2] and counters["num_turns"].tolist() == [2, 2, 2, 2, 3]
    assert counters["tool_errors"].tolist() == [0, 1, 0, 1, 0] and counters["tool_timeouts"].tolist() == [0, 0, 1, 0, 0]
    # the per-row create_kwargs reached the tool, its instance kept its state, its step rewards were summed
    assert "<tool_response>11</tool_response>" in texts[4] and "<tool_response>12</tool_response>" in texts[4]
    assert counters["tool_rewards"].tolist() == [0.0, 0.0, 0.0, 0.0, 23.0]
    assert seconds < 1.0 + 10  # one timeout, not the tool's 60 s (process start-up included)


# The layout of Qwen2.5/Qwen3's chat templates (written for this test): ChatML turns, consecutive tool messages grouped
# into one user turn of <tool_response> blocks, "<|im_end|>\n" after every turn.
QWEN_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_qwen_layout_continues_after_the_sampled_im_end_with_its_newline_glue():
    """The model samples `<|im_end|>`; the template's "\\n" after it is glue, then one user turn holds every tool
    response of the turn, then the generation prompt: exactly what the template renders for the whole conversation."""
    tokenizer = build_char_tokenizer()  # Qwen's special tokens are spelled out character by character here
    tokenizer.chat_template = QWEN_LIKE
    render = ToolResponseIds(tokenizer)
    ids = render(["579", "8"], "<|im_end|>")
    assert tokenizer.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n579\n</tool_response>\n<tool_response>\n8\n</tool_response>"
                                     "<|im_end|>\n<|im_start|>assistant\n")
    turn = '<tool_call>{"name": "add"}</tool_call><|im_end|>'
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": turn.removesuffix("<|im_end|>")},
                {"role": "tool", "content": "579"}, {"role": "tool", "content": "8"}]
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert prompt + turn + tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
