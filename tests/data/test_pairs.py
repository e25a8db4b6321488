"""Preference pairs: tokenized in the chat template, length rules with file:row, interleaved whole pairs."""

import pytest

from rlcore.data.pairs import read_pairs
from rlcore.data.synthetic import make_addition_rows, preference_pairs, write_parquet
from rlcore.data.tokenizer import build_char_tokenizer


@pytest.fixture
def pairs_file(tmp_path):
    rows = preference_pairs(make_addition_rows(6, 1, 2, seed=0), seed=0)
    rows[1]["margin"] = 2.0
    for row in rows:
        row.setdefault("margin", 0.5)
    return write_parquet(rows, str(tmp_path / "pairs.parquet")), rows


def test_pairs_are_tokenized_in_the_chat_template_and_batched_as_whole_pairs(pairs_file):
    path, rows = pairs_file
    assert all(int(r["chosen"]) == eval(r["prompt"][0]["content"][:-1]) != int(r["rejected"]) for r in rows)
    tok = build_char_tokenizer()
    data = read_pairs([path], tok, "prompt", "chosen", "rejected", "margin", 16, "error")
    first = tok.apply_chat_template([*rows[0]["prompt"], {"role": "assistant", "content": rows[0]["chosen"]}], tokenize=False)
    assert tok.decode(data.chosen[0]) == first and first.endswith(rows[0]["chosen"] + tok.eos_token)
    batch = data.batch([1, 3], tok.pad_token_id, 16)
    assert len(batch) == 4 and batch.batch["pair_margin"].tolist() == [2.0, 2.0, 0.5, 0.5]
    rows_text = [tok.decode(r[m.bool()]) for r, m in zip(batch.batch["input_ids"], batch.batch["attention_mask"])]
    assert rows_text[0].endswith(rows[1]["chosen"] + tok.eos_token) and rows_text[1].endswith(rows[1]["rejected"] + tok.eos_token)


def test_overlong_pairs_name_the_file_row_and_the_fix(pairs_file):
    path, _ = pairs_file
    with pytest.raises(ValueError, match=r"pairs.parquet row 0: a pair has \d+ tokens, more than data.max_length=5 .*data.truncation=left"):
        read_pairs([path], build_char_tokenizer(), "prompt", "chosen", "rejected", None, 5, "error")
    kept = read_pairs([path], build_char_tokenizer(), "prompt", "chosen", "rejected", None, 5, "left")
    assert kept.chosen[0][-1] == build_char_tokenizer().eos_token_id  # left truncation happens at batching, ends kept
    with pytest.raises(ValueError, match="no column 'better'"):
        read_pairs([path], build_char_tokenizer(), "prompt", "better", "rejected", None, 16, "error")


def test_the_column_keys_name_what_the_reward_trainer_reads(pairs_file, tmp_path):
    from rlcore.train_rm import compose_rm, load_pairs

    _, rows = pairs_file
    renamed = [{"question": r["prompt"], "good": r["rejected"], "bad": r["chosen"], "gap": r["margin"] * 4} for r in rows]
    path = write_parquet(renamed, str(tmp_path / "renamed.parquet"))
    tok = build_char_tokenizer()
    keys = ["data.prompt_key=question", "data.chosen_key=good", "data.rejected_key=bad", "data.margin_key=gap"]
    train, val = load_pairs(compose_rm([f"data.train_files=[{path}]", "data.val_files=[]", "data.max_length=32", *keys]), tok)
    assert val is None and len(train) == len(rows)
    # "good" holds the wrong answers here: the keys decide which answer is chosen, whatever the column is called
    expected = tok.apply_chat_template([*rows[0]["prompt"], {"role": "assistant", "content": rows[0]["rejected"]}], tokenize=False)
    assert tok.decode(train.chosen[0]) == expected and train.margin[:2] == [2.0, 8.0]
    unmargined = load_pairs(compose_rm([f"data.train_files=[{path}]", "data.val_files=[]", "data.max_length=32", *keys[:3], "data.margin_key=null"]), tok)[0]
    assert unmargined.margin[:2] == [0.0, 0.0]  # no margin column: a plain Bradley-Terry loss
    with pytest.raises(ValueError, match=r"renamed.parquet.*no column 'prompt'.*set data.prompt_key"):
        load_pairs(compose_rm([f"data.train_files=[{path}]", "data.val_files=[]", "data.max_length=32"]), tok)
