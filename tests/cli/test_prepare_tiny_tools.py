"""prepare_tiny_tools on a toy scale: data, a loadable warm-start, the stop rule, and the settings stamp."""

import os

import torch
import transformers

from rlcore.cli.prepare_tiny_tools import SETTINGS, encode_traces, prepare, teacher_forced_exact_match
from rlcore.data.synthetic_tools import tool_trace

TOY = dict(SETTINGS, num_train=60, num_test=20, num_sft=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=2, batch_size=8, warmup_steps=1, max_steps=3, eval_every=2,
           probe_rows=10, stop_exact_match=1.1,  # above 1: never reached, so the SFT runs all max_steps
           probe_below_loss=1e9)  # probes at every eval_every step (the toy's loss stays high)


def test_builds_a_loadable_warm_start_and_reuses_it(tmp_path, capsys):
    torch.set_num_threads(1)
    out = str(tmp_path / "tools")
    model_dir = prepare(out, TOY)
    assert model_dir == os.path.join(out, "sft_model")
    assert sorted(os.listdir(os.path.join(out, "data"))) == ["sft.parquet", "test.parquet", "train.parquet"]
    built = capsys.readouterr().out
    assert "SFT 3 steps" in built and "on 20 held-out test rows" in built

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert model.config.max_position_embeddings == 272 and model.config.num_hidden_layers == 1
    row = {"prompt": [{"role": "user", "content": "100+200+300="}]}
    ids, mask = encode_traces(tokenizer, [[*row["prompt"], *tool_trace(row)]])
    assert 0.0 <= teacher_forced_exact_match(model, ids, mask) <= 1.0

    stamp_mtime = os.path.getmtime(os.path.join(out, "settings.json"))
    assert prepare(out, TOY) == model_dir
    assert "up to date" in capsys.readouterr().out
    assert os.path.getmtime(os.path.join(out, "settings.json")) == stamp_mtime

    # Changed settings rebuild; a threshold of 0 is met at the first probe evaluation (step eval_every).
    prepare(out, dict(TOY, stop_exact_match=0.0))
    assert "SFT 2 steps" in capsys.readouterr().out
    # No probe while the loss is above probe_below_loss: the threshold of 0 is met only at the last step's probe.
    prepare(out, dict(TOY, stop_exact_match=0.0, probe_below_loss=0.0))
    assert "SFT 3 steps" in capsys.readouterr().out
