"""RLHFDataset: chat template + left padding, truncation modes, filtering, errors, collate."""

import numpy as np
import pytest
import torch

from rlcore.data.dataset import RLHFDataset, collate_fn
from rlcore.data.synthetic import write_parquet
from rlcore.data.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
USER, ASSISTANT, PAD = 2, 3, 0


def ids_of(text: str) -> list[int]:
    return TOK.convert_tokens_to_ids(list(text))


def row(content: str, index: int, answer: str = "0") -> dict:
    return {
        "data_source": "tiny_add",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index, "answer": answer},
    }


def make_dataset(path, max_prompt_length, truncation="error", filter_overlong_prompts=False, **kw):
    kw = {"prompt_key": "prompt", "max_samples": -1, "return_raw_chat": False, **kw}
    return RLHFDataset(
        path, TOK, max_prompt_length=max_prompt_length, filter_overlong_prompts=filter_overlong_prompts,
        truncation=truncation, **kw,
    )


def test_left_padding_mask_and_position_ids(tmp_path):
    path = write_parquet([row("1+2=", index=7, answer="3")], str(tmp_path / "d.parquet"))
    item = make_dataset(path, max_prompt_length=8, return_raw_chat=True)[0]
    assert item["input_ids"].tolist() == [PAD, PAD, USER, *ids_of("1+2="), ASSISTANT]
    assert item["attention_mask"].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert item["position_ids"].tolist() == [0, 0, 0, 1, 2, 3, 4, 5]
    assert all(item[k].dtype == torch.long for k in ("input_ids", "attention_mask", "position_ids"))
    assert item["data_source"] == "tiny_add"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "3"}
    assert item["extra_info"] == {"split": "train", "index": 7, "answer": "3"}
    assert item["index"] == 7
    assert item["raw_prompt"] == [{"role": "user", "content": "1+2="}]


def test_exact_fit_has_no_padding(tmp_path):
    path = write_parquet([row("abcd", 0)], str(tmp_path / "d.parquet"))
    item = make_dataset(path, max_prompt_length=6)[0]
    assert item["input_ids"].tolist() == [USER, *ids_of("abcd"), ASSISTANT]
    assert item["attention_mask"].tolist() == [1] * 6
    assert "raw_prompt" not in item


@pytest.mark.parametrize(
    "mode, kept",
    [
        ("left", ids_of("defgh") + [ASSISTANT]),  # last 6 of [U a b c d e f g h A]
        ("right", [USER] + ids_of("abcde")),  # first 6
        ("middle", [USER] + ids_of("ab") + ids_of("gh") + [ASSISTANT]),  # head 3 + tail 3
    ],
)
def test_truncation_modes_keep_exact_ids(tmp_path, mode, kept):
    path = write_parquet([row("abcdefgh", 0), row("xy", 1)], str(tmp_path / "d.parquet"))
    ds = make_dataset(path, max_prompt_length=6, truncation=mode)
    assert len(ds) == 2
    assert ds[0]["input_ids"].tolist() == kept
    assert ds[0]["attention_mask"].tolist() == [1] * 6
    assert ds[1]["input_ids"].tolist() == [PAD, PAD, USER, *ids_of("xy"), ASSISTANT]


def test_truncation_error_names_row_length_limit_and_fix(tmp_path):
    path = write_parquet([row("ab", 0), row("abcdefgh", 1), row("abcdefghijkl", 2)], str(tmp_path / "d.parquet"))
    with pytest.raises(ValueError) as err:
        make_dataset(path, max_prompt_length=6)
    msg = str(err.value)
    assert "row 1" in msg and "has 10 tokens" in msg and "data.max_prompt_length=6" in msg
    assert "data.max_prompt_length >= 14" in msg  # the longest offender, so one fix covers all
    assert "data.filter_overlong_prompts=True" in msg and "data.truncation=left|right|middle" in msg


def test_filter_overlong_prompts(tmp_path, capsys):
    contents = ["ab", "abcdefgh", "abcd", "abcdefghij", "a"]
    path = write_parquet([row(c, i) for i, c in enumerate(contents)], str(tmp_path / "d.parquet"))
    ds = make_dataset(path, max_prompt_length=6, filter_overlong_prompts=True)
    assert len(ds) == 3
    assert [ds[i]["index"] for i in range(3)] == [0, 2, 4]
    assert "dropped 2 of 5 prompts" in capsys.readouterr().out


def test_multiple_files_tilde_and_max_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_parquet([row("a", 0), row("b", 1)], str(tmp_path / "one.parquet"))
    write_parquet([row("c", 0)], str(tmp_path / "two.parquet"))
    ds = make_dataset(["~/one.parquet", "~/two.parquet"], max_prompt_length=4)
    assert [ds[i]["input_ids"][-2].item() for i in range(3)] == ids_of("abc")
    assert len(make_dataset(["~/one.parquet", "~/two.parquet"], max_prompt_length=4, max_samples=2)) == 2
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        make_dataset(str(tmp_path / "missing.parquet"), max_prompt_length=4)


def test_bad_settings_and_prompt_key(tmp_path):
    path = write_parquet([row("a", 0)], str(tmp_path / "d.parquet"))
    with pytest.raises(ValueError, match="data.truncation='cut'"):
        make_dataset(path, max_prompt_length=4, truncation="cut")
    with pytest.raises(ValueError, match=r"1 x column 'question' \(data.prompt_key\) is not a list of chat messages \(at .*d.parquet:0\)"):
        make_dataset(path, max_prompt_length=4, prompt_key="question")


def test_bad_rows_are_reported_with_counts_and_locations_or_skipped(tmp_path, capsys):
    from functools import partial

    from rlcore.data.row_checks import rule_score_problem

    rows = [row("1+2=", i) for i in range(10)]
    rows[1]["prompt"] = []                                   # an empty conversation
    rows[2]["reward_model"] = {"style": "rule"}              # no ground truth
    rows[5]["reward_model"] = {"style": "rule"}
    rows[6]["reward_model"] = {"style": "rule"}
    rows[8]["reward_model"] = {"style": "rule"}
    rows[9]["data_source"] = "gsm9k"                         # no scorer for it
    path = write_parquet(rows, str(tmp_path / "d.parquet"))
    checks = [partial(rule_score_problem, source_key="data_source", scored_sources=["tiny_add"])]
    with pytest.raises(ValueError) as info:
        make_dataset(path, max_prompt_length=16, row_checks=checks)
    assert str(info.value).splitlines() == [
        "6 of 10 rows are unusable:",
        f"  4 x reward_model.ground_truth is missing (the rule scorer compares the response with it) (at {path}:2, {path}:5, {path}:6, ...)",
        f"  1 x column 'prompt' (data.prompt_key) is an empty conversation (at {path}:1)",
        f"  1 x data_source='gsm9k' has no rule scorer (registered: tiny_add; register one, or set reward.custom_reward_function.path) (at {path}:9)",
        "Fix the data, or set data.skip_bad_rows=True to train without these rows"]
    ds = make_dataset(path, max_prompt_length=16, row_checks=checks, skip_bad_rows=True)
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 3, 4, 7]
    assert "dropped 6 of 10 rows are unusable:" in capsys.readouterr().out


def test_collate_fn_stacks_tensors_and_keeps_objects(tmp_path):
    path = write_parquet([row("1+2=", 0, "3"), row("10+20=", 1, "30")], str(tmp_path / "d.parquet"))
    ds = make_dataset(path, max_prompt_length=10, return_raw_chat=True)
    batch = collate_fn([ds[0], ds[1]])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["position_ids"].shape == (2, 10)
    assert torch.equal(batch["input_ids"][1], ds[1]["input_ids"])
    for key in ("data_source", "reward_model", "extra_info", "index", "raw_prompt"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (2,)
    assert batch["reward_model"][1] == {"style": "rule", "ground_truth": "30"}
    assert batch["raw_prompt"][0] == [{"role": "user", "content": "1+2="}]
    single = collate_fn([ds[0]])  # a one-row batch must not unwrap the one-message list
    assert single["raw_prompt"].shape == (1,) and single["raw_prompt"][0] == [{"role": "user", "content": "1+2="}]


def test_tool_schemas_are_rendered_into_the_prompt_by_the_chat_template(tmp_path):
    """With tools configured the dataset passes their schemas to the chat template, as verl's does (Qwen's template
    lists them in its system turn); here a template that prints each tool's name before the messages."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{% for t in tools or [] %}{{ t['function']['name'] }};{% endfor %}" + tokenizer.chat_template
    path = write_parquet([row("1+2=", index=0)], str(tmp_path / "d.parquet"))
    kw = dict(prompt_key="prompt", max_prompt_length=16, filter_overlong_prompts=False, truncation="error", max_samples=-1, return_raw_chat=False)
    with_tools = RLHFDataset(path, tokenizer, tools=[{"type": "function", "function": {"name": "add"}}], **kw)[0]
    without = RLHFDataset(path, tokenizer, **kw)[0]
    assert with_tools["input_ids"][with_tools["attention_mask"].bool()].tolist() == ids_of("add;") + [USER, *ids_of("1+2="), ASSISTANT]
    assert without["input_ids"][without["attention_mask"].bool()].tolist() == [USER, *ids_of("1+2="), ASSISTANT]


THINK_TEMPLATE = (  # Qwen3's switch in miniature: enable_thinking=False writes an empty think block after the prompt
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think></think>' }}{% endif %}{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(tmp_path):
    """data.apply_chat_template_kwargs: the template sees the variables; the prompt ids change exactly by them."""
    tok = build_char_tokenizer()
    tok.chat_template = THINK_TEMPLATE
    path = write_parquet([row("1+2=", 0)], str(tmp_path / "d.parquet"))
    kw = dict(prompt_key="prompt", max_prompt_length=32, filter_overlong_prompts=False, truncation="error", max_samples=-1, return_raw_chat=False)
    plain = RLHFDataset(path, tok, **kw).prompt_ids[0]
    off = RLHFDataset(path, tok, chat_template_kwargs={"enable_thinking": False}, **kw).prompt_ids[0]
    assert plain == [USER, *ids_of("1+2="), ASSISTANT]
    assert off == [*plain, *ids_of("<think></think>")]
    with pytest.raises(ValueError, match=r"data.apply_chat_template_kwargs sets \['add_generation_prompt'\]"):
        RLHFDataset(path, tok, chat_template_kwargs={"add_generation_prompt": False}, **kw)


def test_return_full_prompt_keeps_the_templated_text(tmp_path):
    """data.return_full_prompt: each item carries the rendered prompt string (verl's `full_prompts`), filtered with its row."""
    path = write_parquet([row("1+2=", 0), row("x" * 20, 1), row("3+4=", 2)], str(tmp_path / "d.parquet"))
    data = make_dataset(path, max_prompt_length=8, filter_overlong_prompts=True, return_full_prompt=True)
    assert [data[i]["full_prompts"] for i in range(len(data))] == ["<|user|>1+2=<|assistant|>", "<|user|>3+4=<|assistant|>"]
    assert "full_prompts" not in make_dataset(path, max_prompt_length=8, filter_overlong_prompts=True)[0]
    batch = collate_fn([data[0], data[1]])
    assert batch["full_prompts"].tolist() == ["<|user|>1+2=<|assistant|>", "<|user|>3+4=<|assistant|>"]
