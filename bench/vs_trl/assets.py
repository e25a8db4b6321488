"""The shared workload of grpo_arith_cpu_v1.json, built once for both trainers: the character tokenizer, the
random-init Qwen2, the prompts (JSONL for TRL, verl-format parquet for rlcore) and the exact-sum scorer."""

from __future__ import annotations

import json
import os
import random
import string

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_arith_cpu_v1.json")
DATA_SOURCE = "grpo_arith_cpu_v1"
# rlcore renders prompts through the chat template (verl's row format holds chat messages): this one writes the
# user's text after <bos>, so both trainers see the same ids: <bos> + the characters of the prompt.
CHAT_TEMPLATE = "{{ bos_token }}{{ messages[0]['content'] }}"
SCORER = '''import re


def exact_sum(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 if the completion (stripped) starts with the exact sum, not followed by another digit."""
    match = re.match(r"\\d+", solution_str.strip())
    return 1.0 if match is not None and match.group(0) == ground_truth else 0.0
'''


def load_spec(path: str = SPEC_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def build_tokenizer(spec: dict) -> PreTrainedTokenizerFast:
    tok = spec["tokenizer"]
    vocab = {t: i for i, t in enumerate(tok["special_tokens"])}
    vocab.update({chr(c): c - 28 for c in range(32, 127)})  # the spec's id(chr(c)) = c - 28
    assert len(vocab) == tok["vocab_size"]
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tok["special_tokens"]])
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left", chat_template=CHAT_TEMPLATE,
                                   clean_up_tokenization_spaces=False)


def build_model(spec: dict) -> Qwen2ForCausalLM:
    m = {k: v for k, v in spec["model"].items() if k not in ("architecture", "init", "dtype", "num_parameters", "attn_implementation")}
    torch.manual_seed(spec["seed"])  # the spec: seeded immediately before construction
    model = Qwen2ForCausalLM(Qwen2Config(**m, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    assert sum(p.numel() for p in model.parameters()) == spec["model"]["num_parameters"]
    return model


def prompts(spec: dict) -> list[dict[str, str]]:
    task, rng = spec["task"], random.Random(spec["seed"])
    rows = []
    for _ in range(task["num_prompts"]):
        a = rng.randint(task["operand_min"], task["operand_max"])
        b = rng.randint(task["operand_min"], task["operand_max"])
        rows.append({"prompt": task["prompt_template"].format(a=a, b=b), "answer": str(a + b)})
    return rows


def build_assets(out_dir: str, spec_path: str = SPEC_PATH) -> dict:
    """Writes model/, tokenizer/, prompts.jsonl, train.parquet and exact_sum.py under out_dir; returns the spec."""
    spec = load_spec(spec_path)
    build_tokenizer(spec).save_pretrained(os.path.join(out_dir, "tokenizer"))
    build_tokenizer(spec).save_pretrained(os.path.join(out_dir, "model"))  # rlcore reads the tokenizer from model.path
    build_model(spec).save_pretrained(os.path.join(out_dir, "model"))
    rows = prompts(spec)
    with open(os.path.join(out_dir, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    table = pa.Table.from_pylist([{
        "data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": r["prompt"]}],
        "reward_model": {"style": "rule", "ground_truth": r["answer"]}, "extra_info": {"index": i},
    } for i, r in enumerate(rows)])
    pq.write_table(table, os.path.join(out_dir, "train.parquet"))
    with open(os.path.join(out_dir, "exact_sum.py"), "w") as f:
        f.write(SCORER)
    assert set(string.digits) <= set(build_tokenizer(spec).get_vocab())
    return spec
