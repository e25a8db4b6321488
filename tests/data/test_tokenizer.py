"""The offline char tokenizer: exact ids, chat template, decoding, save/load round trip."""

import string

import pytest
import transformers

from rlcore.data.tokenizer import CHAT_TEMPLATE, build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(model_max_length=512)


def test_special_token_ids_and_settings(tok):
    assert (tok.pad_token, tok.pad_token_id) == ("<|pad|>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", 1)
    assert tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>", "<|system|>"]) == [2, 3, 4]
    assert tok.padding_side == "left"
    assert tok.model_max_length == 512
    assert len(tok) == 6 + 96  # specials + digits, letters, punctuation, space, newline


def test_chat_template_exact_text_and_ids(tok):
    messages = [{"role": "user", "content": "37+45="}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>37+45=<|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    digit = {c: tok.convert_tokens_to_ids(c) for c in "0123456789"}
    assert digit["0"] == 6 and digit["9"] == 15
    plus, equals = tok.convert_tokens_to_ids(["+", "="])
    assert ids == [2, digit["3"], digit["7"], plus, digit["4"], digit["5"], equals, 3]
    assert len(ids) == 2 + len("37+45=")
    # add_special_tokens=True adds nothing: there is no bos/eos post-processor.
    assert tok(text)["input_ids"] == ids


def test_chat_template_roles_and_eos(tok):
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
    ]
    assert tok.apply_chat_template(messages, tokenize=False) == "<|system|>Add.<|user|>1+1=<|assistant|>2<|endoftext|>"
    with pytest.raises(Exception, match="unsupported chat role function"):
        tok.apply_chat_template([{"role": "function", "content": "x"}], tokenize=False)


def test_chat_template_tool_role_is_a_user_turn(tok):
    # The agent loop appends exactly these ids after a tool call's eos, so the template must render them the same.
    call = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'
    messages = [{"role": "user", "content": "1+2+3="}, {"role": "assistant", "content": call},
                {"role": "tool", "content": "3"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == f"<|user|>1+2+3=<|assistant|>{call}<|endoftext|><|user|><tool_response>3</tool_response><|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    markers = ("<|user|>", "<|assistant|>", "<|endoftext|>", "<|user|>", "<|assistant|>")  # one id each
    assert len(ids) == len(text) - sum(len(m) - 1 for m in markers)
    assert tok.decode(ids, skip_special_tokens=True) == f"1+2+3={call}<tool_response>3</tool_response>"


def test_decode_round_trip_without_inserted_spaces(tok):
    text = "Hello , world ' s don't  x\n y. " + string.punctuation + string.digits
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_skip_special_tokens(tok):
    ids = tok("<|user|>1+1=<|assistant|>2<|endoftext|><|pad|>")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "1+1=2"
    assert tok.decode(ids) == "<|user|>1+1=<|assistant|>2<|endoftext|><|pad|>"


def test_out_of_vocab_is_unk(tok):
    assert tok.encode("a\tb") == [tok.convert_tokens_to_ids("a"), tok.unk_token_id, tok.convert_tokens_to_ids("b")]


def test_left_padding(tok):
    batch = tok(["1+1=", "12+345="], padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][:3] == [0, 0, 0]
    assert batch["attention_mask"][0] == [0, 0, 0, 1, 1, 1, 1]


def test_save_and_auto_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "<|system|>s<|user|>Q: 12+7=?\n<|assistant|>19<|endoftext|>"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.chat_template == tok.chat_template == CHAT_TEMPLATE
    assert loaded.all_special_tokens == tok.all_special_tokens
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 5)
    assert loaded.padding_side == "left" and loaded.model_max_length == 512
    assert loaded.get_vocab() == tok.get_vocab()
    assert loaded.decode(loaded.encode("a , b")) == "a , b"
