"""The reward-model worker: scores equal the HF reward model's at each conversation's last token, in the policy's
tokens or re-rendered in the reward model's own chat template; the reward manager then uses them as the scores."""

import copy

import numpy as np
import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo
from omegaconf import OmegaConf
from transformers import AutoTokenizer, Qwen2ForSequenceClassification

from rlcore.config import compose
from rlcore.config.reward_model_schema import uses_token_budgets
from rlcore.data.rm_inputs import right_aligned, same_tokenization, token_level
from rlcore.models.hf import load_config
from rlcore.protocol import DataProto
from rlcore.reward.manager import RewardManager
from rlcore.rollout.base import RolloutOutput, assemble_sequences
from rlcore.workers.reward_model import RewardModelWorker

pytestmark = pytest.mark.numerics


def save_reward_model(base_dir: str, out_dir: str, chat_template: str | None = None) -> str:
    config = load_config(base_dir)
    config.num_labels = 1
    torch.manual_seed(7)
    rm = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_right_aligned_keeps_the_end_and_token_level_marks_the_last_response_token():
    t = right_aligned([[5, 6, 7, 8], [9, 10]], pad_token_id=0, max_length=3)
    assert t["input_ids"].tolist() == [[6, 7, 8], [0, 9, 10]] and t["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert t["position_ids"].tolist() == [[0, 1, 2], [0, 0, 1]] and t["responses"].tolist() == [[8], [10]]
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    assert token_level(torch.tensor([2.0, 3.0, 4.0]), mask).tolist() == [[0, 2.0, 0], [0, 0, 0], [0, 0, 4.0]]


def rollout_batch(tokenizer, prompts, answers, response_len=6):
    """The trainer's layout: left-padded prompts, right-padded responses (+ EOS), raw chat kept."""
    prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in prompts]
    prompt_ids = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in prompt_ids]
    width, pad = max(map(len, prompt_ids)), tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompt_ids])[:, None]).long()
    responses = [tokenizer.encode(a, add_special_tokens=False) + [tokenizer.eos_token_id] for a in answers]
    out = RolloutOutput(
        responses=torch.tensor([r + [pad] * (response_len - len(r)) for r in responses]),
        response_log_probs=torch.zeros(len(answers), response_len),
        response_mask=torch.tensor([[1] * len(r) + [0] * (response_len - len(r)) for r in responses]))
    data = DataProto.from_dict(assemble_sequences(ids, mask, out))
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = prompts
    data.non_tensor_batch["raw_prompt"] = raw
    return data


def hf_scores(rm_dir, sequences):
    rm = Qwen2ForSequenceClassification.from_pretrained(rm_dir).eval()
    with torch.no_grad():
        return torch.stack([rm(input_ids=torch.tensor([s])).logits[0, 0] for s in sequences])


PROMPTS = [[{"role": "user", "content": "12+7="}], [{"role": "user", "content": "3+4="}], [{"role": "user", "content": "50+50="}]]
ANSWERS = ["19", "8", "100"]


# verl's reward-loop scripts: the RM served by an inference engine and no micro-batch size; rlcore runs the same forward
# in its worker group, filled by tokens (a budget of 24 splits the three samples over micro-batches)
REWARD_LOOP = ("reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm", "reward_model.rollout.gpu_memory_utilization=0.8",
               "reward.num_workers=8", "reward_model.forward_max_token_len_per_gpu=24")


@pytest.mark.parametrize("template,batching", [
    (None, ("reward_model.micro_batch_size_per_gpu=2",)),
    ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}", ("reward_model.micro_batch_size_per_gpu=2",)),
    (None, REWARD_LOOP)], ids=["same", "own-template", "reward-loop"])
def test_scores_equal_the_hf_reward_model_at_the_last_token(tiny_model_dir, tmp_path, template, batching):
    rm_dir = save_reward_model(tiny_model_dir, str(tmp_path / "rm"), template)
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", "reward.reward_model.enable=True",
                   f"reward.reward_model.model_path={rm_dir}", *batching, "reward_model.model.fsdp_config.dtype=float32"])
    assert uses_token_budgets(cfg.reward_model) == (batching == REWARD_LOOP)
    policy_tok, rm_tok = AutoTokenizer.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(rm_dir)
    assert same_tokenization(policy_tok, rm_tok) == (template is None)
    data = rollout_batch(policy_tok, PROMPTS, ANSWERS)
    init_gloo(0, 1, free_port())
    try:
        worker = RewardModelWorker(OmegaConf.to_container(cfg, resolve=True))
        worker.init_model(1)
        rm_scores = worker.compute_rm_score(copy.deepcopy(data)).batch["rm_scores"]
    finally:
        close_gloo()
    if template is None:  # the policy's own tokens, prompt and response, EOS included
        sequences = [row[m.bool()].tolist() for row, m in zip(data.batch["input_ids"], data.batch["attention_mask"])]
    else:  # the conversation re-rendered in the reward model's template (no EOS: the template ends the turn)
        sequences = [rm_tok.encode(f"[user]{p[0]['content']}[assistant]{a}", add_special_tokens=False) for p, a in zip(PROMPTS, ANSWERS)]
    expected = hf_scores(rm_dir, sequences)
    lengths = data.batch["response_mask"].sum(-1)
    torch.testing.assert_close(rm_scores[torch.arange(3), lengths - 1], expected, atol=1e-5, rtol=0)
    assert int((rm_scores != 0).sum()) == 3  # one score per sample, on its last response token
    scores, extras = RewardManager(policy_tok)(data.union(DataProto.from_dict({"rm_scores": rm_scores})))
    assert torch.equal(scores, rm_scores) and extras == {}  # verl's naive manager: the RM score is the score


RM_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"


def test_input_tokenizer_says_whose_tokens_the_batch_holds_and_max_length_keeps_each_sequences_end(tmp_path, monkeypatch):
    """reward_model.model.input_tokenizer: the policy's tokenizer, which decodes the responses; when it tokenizes
    unlike the reward model's, the conversation is re-rendered in the RM's template, else its ids are read as they
    are. reward_model.max_length: each sequence the RM scores keeps its last max_length tokens. The engine is
    replaced by a recorder (tests above compare the real one with HF)."""
    import contextlib

    import rlcore.workers.reward_model as rmw
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.workers import phases

    policy_dir, rm_dir = str(tmp_path / "policy"), str(tmp_path / "rm")
    build_char_tokenizer().save_pretrained(policy_dir)
    rm_tok = build_char_tokenizer()
    rm_tok.chat_template = RM_TEMPLATE
    rm_tok.save_pretrained(rm_dir)
    scored = []
    monkeypatch.setattr(rmw, "engine_spec", lambda *args, **kwargs: None)
    monkeypatch.setattr(rmw, "build_engine", lambda *args, **kwargs: "engine")
    monkeypatch.setattr(rmw, "layout_of", lambda engine: None)
    monkeypatch.setattr(rmw.RewardModelWorker, "micro_batches", lambda self, name, engine: None)
    monkeypatch.setattr(phases, "leave", lambda engine: None)
    monkeypatch.setattr(phases, "running", lambda engine, phase: contextlib.nullcontext())
    monkeypatch.setattr(rmw, "run_forward", lambda engine, inputs, micro, fn: scored.append(inputs) or DataProto.from_dict(
        {"scores": inputs.batch["attention_mask"].sum(-1, keepdim=True).float()}))

    def worker(*overrides):
        cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={policy_dir}", "reward.reward_model.enable=True",
                       f"reward.reward_model.model_path={rm_dir}", *overrides])
        w = RewardModelWorker(OmegaConf.to_container(cfg, resolve=True))
        w.init_model(1)
        return w

    policy_tok = build_char_tokenizer()
    data = rollout_batch(policy_tok, PROMPTS[:2], ANSWERS[:2])
    policy_ids = [row[m.bool()].tolist() for row, m in zip(data.batch["input_ids"], data.batch["attention_mask"])]
    rerendered = [rm_tok.encode(f"[user]{p[0]['content']}[assistant]{a}", add_special_tokens=False) for p, a in zip(PROMPTS, ANSWERS[:2])]

    policy_side = worker(f"reward_model.model.input_tokenizer={policy_dir}")  # the default: actor_rollout_ref.model.path
    assert policy_side.retokenize and policy_side._sequences(data) == rerendered
    rm_side = worker(f"reward_model.model.input_tokenizer={rm_dir}")  # the batch's ids are already the RM's
    assert not rm_side.retokenize and rm_side._sequences(data) == policy_ids

    rm_side.compute_rm_score(copy.deepcopy(data))
    assert scored[-1].batch["input_ids"].shape[1] == max(map(len, policy_ids))  # max_length=null: whole sequences
    out = worker(f"reward_model.model.input_tokenizer={rm_dir}", "reward_model.max_length=5").compute_rm_score(copy.deepcopy(data))
    assert scored[-1].batch["input_ids"].tolist() == [ids[-5:] for ids in policy_ids]  # the last 5 tokens: the answer's end
    assert out.batch["rm_scores"].sum(-1).tolist() == [5.0, 5.0]  # each row's score (here its length) on its last token
