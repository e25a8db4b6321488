"""SFT rows: the RL layout (left-padded prompt, right-padded response + EOS) and the truncation rules."""

import pytest

from rlcore.data.sft_rows import read_sft
from rlcore.data.synthetic import write_parquet
from rlcore.data.tokenizer import build_char_tokenizer


def test_layout_and_string_prompts(tmp_path):
    tok = build_char_tokenizer()
    chat = write_parquet([{"prompt": [{"role": "user", "content": "1+2="}], "response": "3"}], str(tmp_path / "chat.parquet"))
    plain = write_parquet([{"prompt": "10+20=", "response": "30"}], str(tmp_path / "plain.parquet"))
    data = read_sft([chat, plain], tok, "prompt", "response", 32, "error")
    batch = data.batch([0, 1], tok.pad_token_id).batch
    # a plain-string prompt is one user turn in the chat template
    assert tok.decode(data.prompts[1]) == tok.apply_chat_template([{"role": "user", "content": "10+20="}], add_generation_prompt=True, tokenize=False)
    assert batch["responses"].tolist()[0] == tok.encode("3", add_special_tokens=False) + [tok.eos_token_id, tok.pad_token_id]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    valid = [tok.decode(r[m.bool()]) for r, m in zip(batch["input_ids"], batch["attention_mask"])]
    assert valid[1].endswith("10+20=<|assistant|>30" + tok.eos_token)
    assert batch["position_ids"][0, batch["attention_mask"][0].argmax()] == 0  # positions count real tokens only


def test_truncation_rules_name_the_row_and_the_fix(tmp_path):
    tok = build_char_tokenizer()
    path = write_parquet([{"prompt": "12345+6789=", "response": "18134"}], str(tmp_path / "long.parquet"))
    prompt_len = len(read_sft([path], tok, "prompt", "response", 64, "error").prompts[0])
    with pytest.raises(ValueError, match=r"long.parquet row 0: prompt \d+ \+ response 6 tokens is more than data.max_length=10; raise"):
        read_sft([path], tok, "prompt", "response", 10, "error")
    left = read_sft([path], tok, "prompt", "response", 10, "left")
    assert len(left.prompts[0]) == 4 and len(left.responses[0]) == 6  # the prompt's start dropped, the answer kept
    right = read_sft([path], tok, "prompt", "response", prompt_len + 2, "right")
    assert len(right.responses[0]) == 2  # the response's end dropped (EOS included)
    with pytest.raises(ValueError, match="data.truncation=right cannot cut that much"):
        read_sft([path], tok, "prompt", "response", prompt_len - 1, "right")


def test_prompt_key_and_response_key_name_the_columns_sft_reads(tmp_path):
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    path = write_parquet([{"question": "1+2=", "answer": "3", "prompt": "9+9=", "response": "18"}], str(tmp_path / "qa.parquet"))
    files = [f"data.train_files=[{path}]", "data.val_files=[]", "data.max_length=32"]
    train, _ = load_rows(compose_sft([*files, "data.prompt_key=question", "data.response_key=answer"]), tok)
    assert train.prompts[0] == read_sft([path], tok, "question", "answer", 32, "error").prompts[0]
    assert tok.decode(train.prompts[0]).endswith("1+2=<|assistant|>") and train.responses[0] == tok.encode("3", add_special_tokens=False) + [tok.eos_token_id]
    default, _ = load_rows(compose_sft(files), tok)  # verl's defaults: the prompt and response columns
    assert default.responses[0] == tok.encode("18", add_special_tokens=False) + [tok.eos_token_id]


def test_data_files_take_one_path_as_a_string_as_verls_do(tmp_path):
    # verl's SFT scripts pass data.train_files=$HOME/data/gsm8k/train.parquet: a string, not a list
    from rlcore.train_rm import compose_rm
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    path = write_parquet([{"prompt": "1+2=", "response": "3"}], str(tmp_path / "one.parquet"))
    train, val = load_rows(compose_sft([f"data.train_files={path}", f"data.val_files={path}", "data.max_length=32"]), tok)
    assert len(train.prompts) == len(val.prompts) == 1
    assert compose_rm([f"data.train_files={path}"]).data.train_files == path


def test_verls_dict_keys_read_the_prompt_and_answer_out_of_a_dict_column(tmp_path):
    # verl's GSM8K SFT scripts: data.prompt_key=extra_info data.prompt_dict_keys=[question] +data.response_dict_keys=[answer]
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    path = write_parquet([{"extra_info": {"question": "1+2=", "answer": "3", "index": 0}}], str(tmp_path / "gsm.parquet"))
    cfg = compose_sft([f"data.train_files={path}", "data.val_files=null", "data.max_length=32", "data.prompt_key=extra_info",
                       "data.response_key=extra_info", "data.prompt_dict_keys=[question]", "+data.response_dict_keys=[answer]"])
    train, _ = load_rows(cfg, tok)
    assert tok.decode(train.prompts[0]).endswith("1+2=<|assistant|>")
    assert train.responses[0] == tok.encode("3", add_special_tokens=False) + [tok.eos_token_id]
    with pytest.raises(ValueError, match=r"gsm.parquet row 0: column 'extra_info' has no key 'query' \(it has \['answer', 'index', "
                                         r"'question'\]\); check data.prompt_dict_keys"):
        read_sft([path], tok, "extra_info", "extra_info", 32, "error", ["query"], ["answer"])


def test_verls_top_level_use_remove_padding_decides_packing():
    from rlcore.engine.factory import engine_spec
    from rlcore.train_sft import compose_sft

    def packed(*overrides):
        cfg = compose_sft(list(overrides))
        return engine_spec(cfg.model.strategy, cfg.model, cfg.model, cfg.optim, cfg.optim.clip_grad, 10).use_remove_padding

    assert packed() and not packed("use_remove_padding=false")  # verl's fsdp_sft_trainer key, at the top
    assert not packed("use_remove_padding=true", "model.use_remove_padding=false")  # the model's own key still wins


CONVERSATION = [{"role": "system", "content": "S"}, {"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
                {"role": "user", "content": "x2?"}, {"role": "assistant", "content": "6"}]


def test_multiturn_rows_learn_every_assistant_turn_and_nothing_else(tmp_path):
    """data.multiturn (verl's multi-turn SFT): the prompt is what precedes the first assistant turn, the loss covers each
    assistant turn's content and end-of-turn token, never a header or the user's turn between them."""
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    path = write_parquet([{"messages": CONVERSATION}], str(tmp_path / "chats.parquet"))
    cfg = compose_sft([f"data.train_files={path}", "data.val_files=[]", "data.max_length=64", "data.multiturn.enable=true",
                       "data.multiturn.messages_key=messages"])
    data, _ = load_rows(cfg, tok)
    assert tok.decode(data.prompts[0]) == "<|system|>S<|user|>1+2=<|assistant|>"
    batch = data.batch([0], tok.pad_token_id).batch
    response, mask = batch["responses"][0], batch["response_mask"][0]
    assert tok.decode(response) == "3<|endoftext|><|user|>x2?<|assistant|>6<|endoftext|>"
    learned = [tok.decode(response[i:i + 1]) for i in range(len(response)) if mask[i]]
    assert "".join(learned) == "3<|endoftext|>6<|endoftext|>"
    # right truncation cuts the loss mask with the tokens it cuts
    short = compose_sft([f"data.train_files={path}", "data.val_files=[]", f"data.max_length={len(data.prompts[0]) + 3}",
                         "data.truncation=right", "data.multiturn.enable=true"])
    cut, _ = load_rows(short, tok)
    assert cut.loss_masks[0] == [1, 1, 0] and len(cut.responses[0]) == 3


def test_multiturn_refuses_a_template_that_rewrites_earlier_turns(tmp_path):
    from rlcore.data.sft_rows import conversation_ids

    tok = build_char_tokenizer()
    # marks the last message: rendering more messages changes how an earlier one looks
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ':' + m['content'] }}{% if loop.last %}.{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match=r"row 7: the chat template renders message 2 differently once later messages follow"):
        conversation_ids(tok, CONVERSATION, "chats.parquet row 7")
    with pytest.raises(ValueError, match="has no assistant turn to learn"):
        conversation_ids(build_char_tokenizer(), CONVERSATION[:2], "row 0")


def test_multiturn_hands_the_rows_tools_and_thinking_flag_to_the_template(tmp_path):
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    tok.chat_template = ("{% if tools %}[{{ tools | length }} tools]{% endif %}{% if enable_thinking %}[think]{% endif %}"
                         "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% if m['role'] == 'assistant' %}"
                         "{{ '<|endoftext|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tools = [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object", "required": ["a"]}}}]
    path = write_parquet([{"conv": CONVERSATION[1:3], "fns": tools, "think": True}], str(tmp_path / "tools.parquet"))
    cfg = compose_sft([f"data.train_files={path}", "data.val_files=[]", "data.max_length=64", "data.multiturn.enable=true",
                       "data.multiturn.messages_key=conv", "data.multiturn.tools_key=fns", "data.multiturn.enable_thinking_key=think"])
    data, _ = load_rows(cfg, tok)
    assert tok.decode(data.prompts[0]) == "[1 tools][think]<|user|>1+2=<|assistant|>"


def test_verl_0_9_conversation_keys_read_every_row_as_a_conversation_with_its_template_arguments(tmp_path):
    """verl 0.9's sft_trainer: data.messages_key (and tools_key, enable_thinking_key) at the data section's top, the
    thinking flag's default for rows without one, apply_chat_template_kwargs for every row, and the row limits."""
    from rlcore.train_sft import compose_sft, load_rows

    tok = build_char_tokenizer()
    tok.chat_template = ("{% if tools %}[{{ tools | length }} tools]{% endif %}{% if enable_thinking %}[think]{% endif %}"
                         "{% if lang %}[{{ lang }}]{% endif %}"
                         "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% if m['role'] == 'assistant' %}"
                         "{{ '<|endoftext|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tools = [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object", "required": ["a"]}}}]
    rows = [{"conv": CONVERSATION[1:3], "fns": tools}, {"conv": CONVERSATION[1:3], "fns": None}, {"conv": CONVERSATION[1:3], "fns": None}]
    path = write_parquet(rows, str(tmp_path / "chats.parquet"))
    cfg = compose_sft([f"data.train_files={path}", f"data.val_files={path}", "data.max_length=64", "data.messages_key=conv",
                       "data.tools_key=fns", "data.enable_thinking_default=true", "+data.apply_chat_template_kwargs.lang=en",
                       "data.train_max_samples=2", "data.val_max_samples=1"])
    train, val = load_rows(cfg, tok)
    assert [tok.decode(p) for p in train.prompts] == ["[1 tools][think][en]<|user|>1+2=<|assistant|>",
                                                      "[think][en]<|user|>1+2=<|assistant|>"]
    assert len(val) == 1
    assert train.loss_masks is not None  # a conversation: the loss covers the assistant's turns only
    # without messages_key the rows are prompt/response rows (verl's fsdp_sft_trainer), as before
    plain = compose_sft([f"data.train_files={path}", "data.val_files=[]"])
    with pytest.raises(ValueError, match="no column 'prompt'"):
        load_rows(plain, tok)
