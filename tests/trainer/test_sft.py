import torch

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.trainer.sft import greedy_accuracy, tokenize_sft, train_sft

ROWS = [
    {"data_source": "tiny_add", "prompt": [{"role": "user", "content": f"{a}+{b}="}], "response": str(a + b), "reward_model": {"ground_truth": str(a + b)}}
    for a, b in [(1, 2), (30, 4), (55, 55), (9, 90)]
]


def test_tokenize_sft_layout_matches_rl_layout():
    tok = build_char_tokenizer()
    data = tokenize_sft(ROWS[:1], tok, max_prompt_length=8, max_response_length=4)
    prompt = tok.apply_chat_template(ROWS[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>1+2=<|assistant|>"  # 6 ids: left-padded by 2 in an 8-wide prompt
    ids = data["input_ids"][0].tolist()
    pad, eos = tok.pad_token_id, tok.eos_token_id
    assert ids[:2] == [pad, pad] and ids[8:] == [tok.convert_tokens_to_ids("3"), eos, pad, pad]
    assert data["attention_mask"][0].tolist() == [0, 0] + [1] * 8 + [0, 0]
    assert data["response_mask"][0].tolist() == [1, 1, 0, 0]
    assert data["position_ids"][0, 2].item() == 0  # positions count real tokens only


def test_sft_memorises_four_rows_and_stop_fn_ends_early(tiny_model_dir):
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model_dir)
    data = tokenize_sft(ROWS, tok, 8, 4)
    assert greedy_accuracy(model, tok, ROWS, 8, 4) == 0.0
    checks = []

    def stop(step):
        checks.append(step)
        return greedy_accuracy(model, tok, ROWS, 8, 4) == 1.0

    losses = train_sft(model, data, steps=400, batch_size=4, lr=3e-3, seed=0, stop_fn=stop, stop_every=20)
    assert greedy_accuracy(model, tok, ROWS, 8, 4) == 1.0
    assert len(losses) == checks[-1] < 400 and losses[-1] < losses[0] / 5
