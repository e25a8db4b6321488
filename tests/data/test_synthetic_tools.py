"""The tiny_add3 task: row format, disjoint splits, the tool-use traces and their assistant-only loss spans."""

import json

import pyarrow.parquet as pq
import pytest

from rlcore.data.synthetic_tools import TASK_NAME, assistant_token_spans, make_add3_rows, row_operands, tool_trace, write_task
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.reward.scorers import TINY_ADD3, default_compute_score


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_row_format_and_operands():
    rows = make_add3_rows(200, seed=0, split="test")
    a, b, c = row_operands(rows[0])
    assert rows[0] == {
        "data_source": "tiny_add3",
        "prompt": [{"role": "user", "content": f"{a}+{b}+{c}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b + c)},
        "extra_info": {"split": "test", "index": 0, "answer": str(a + b + c)},
    }
    triples = [row_operands(r) for r in rows]
    assert len(set(triples)) == 200 and all(100 <= x <= 999 for t in triples for x in t)
    assert [r["extra_info"]["index"] for r in rows] == list(range(200))
    assert make_add3_rows(200, seed=0, split="test") == rows  # reproducible
    assert TASK_NAME == TINY_ADD3  # the scorer is registered under the task's data_source


def test_write_task_disjoint_splits_and_traces(tmp_path):
    paths = write_task(str(tmp_path), num_train=300, num_test=100, num_sft=50, seed=0)
    train, test, sft = (pq.read_table(paths[k]).to_pylist() for k in ("train", "test", "sft"))
    assert (len(train), len(test), len(sft)) == (300, 100, 50)
    assert not {row_operands(r) for r in train} & {row_operands(r) for r in test}
    for train_row, sft_row in zip(train, sft):
        assert sft_row == {**train_row, "messages": [*train_row["prompt"], *tool_trace(train_row)]}
    with pytest.raises(ValueError, match="num_sft <= num_train"):
        write_task(str(tmp_path), num_train=10, num_test=10, num_sft=11, seed=0)


def test_trace_renders_in_the_agent_loop_format(tok):
    row = {"prompt": [{"role": "user", "content": "123+456+789="}]}
    trace = tool_trace(row)
    call1, call2 = (json.dumps({"name": "add", "arguments": args}, separators=(",", ":")) for args in ({"a": 123, "b": 456}, {"a": 579, "b": 789}))
    assert trace == [
        {"role": "assistant", "content": f"<tool_call>{call1}</tool_call>"}, {"role": "tool", "content": "579"},
        {"role": "assistant", "content": f"<tool_call>{call2}</tool_call>"}, {"role": "tool", "content": "1368"},
        {"role": "assistant", "content": "1368"},
    ]
    text = tok.apply_chat_template([*row["prompt"], *trace], tokenize=False)
    assert text == ("<|user|>123+456+789=<|assistant|>"
                    f"<tool_call>{call1}</tool_call><|endoftext|><|user|><tool_response>579</tool_response><|assistant|>"
                    f"<tool_call>{call2}</tool_call><|endoftext|><|user|><tool_response>1368</tool_response><|assistant|>"
                    "1368<|endoftext|>")
    # What the scorer is given: the response (everything after the prompt) decoded without special tokens.
    ids, spans = assistant_token_spans(tok, [*row["prompt"], *trace])
    response = tok.decode(ids[spans[0][0]:], skip_special_tokens=True)
    assert response == f"<tool_call>{call1}</tool_call><tool_response>579</tool_response><tool_call>{call2}</tool_call><tool_response>1368</tool_response>1368"
    assert default_compute_score(TASK_NAME, response, "1368") == 1.0


def test_loss_spans_cover_exactly_the_assistant_content_and_eos(tok):
    messages = [{"role": "user", "content": "999+999+999="}, *tool_trace({"prompt": [{"role": "user", "content": "999+999+999="}]})]
    ids, spans = assistant_token_spans(tok, messages)
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False))["input_ids"]
    assert [tok.decode(ids[start:end]) for start, end in spans] == [m["content"] + "<|endoftext|>" for m in messages if m["role"] == "assistant"]
    assistant = tok.convert_tokens_to_ids("<|assistant|>")
    assert all(ids[start - 1] == assistant for start, _ in spans)  # the marker itself gets no loss
    masked = set().union(*(range(start, end) for start, end in spans))
    outside = tok.decode([t for i, t in enumerate(ids) if i not in masked])
    assert outside == ("<|user|>999+999+999=<|assistant|><|user|><tool_response>1998</tool_response><|assistant|>"
                       "<|user|><tool_response>2997</tool_response><|assistant|>")
    # The longest trace (all operands 999): 14 prompt tokens, 216 response tokens, inside max_response_length 256.
    assert (spans[0][0], len(ids) - spans[0][0]) == (14, 216)
