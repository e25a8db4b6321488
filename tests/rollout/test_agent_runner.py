"""Custom agent loops in verl's shape: rows routed by agent_name, their requests batched into engine calls, their
trajectories made of exactly the ids the engine sampled (with its log-probs), the built-in loops beside them; and
verl's agent-loop YAML, checked before Ray starts."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from rlcore.config import compose
from rlcore.config.agent_loop_config import AgentLoopSpec, agent_name_problem, load_agent_loop_config
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.rollout.agent_api import AgentLoopBase, AgentLoopOutput
from rlcore.rollout.agent_loop import left_pad
from rlcore.rollout.agent_runner import AgentRunner
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout

SAMPLED: dict[str, list] = {}  # request id -> what the server returned for it, turn by turn (the loops record it)


class TwoTurnLoop(AgentLoopBase):
    """verl's shape: renders raw_prompt itself, generates, appends a user turn ("again"), generates once more with
    the same request id; records every TokenOutput it got."""

    def __init__(self, *args: Any, feedback: str = "again", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feedback = feedback

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        rid = f"row{kwargs['index']}"
        response, mask, log_probs = [], [], []
        for turn in range(2):
            out = await self.server_manager.generate(rid, prompt_ids=prompt + response, sampling_params={**sampling_params, "max_tokens": 6})
            SAMPLED.setdefault(rid, []).append(out)
            response, mask, log_probs = response + out.token_ids, mask + [1] * len(out.token_ids), log_probs + out.log_probs
            if turn == 0:
                user = await self.apply_chat_template([{"role": "user", "content": self.feedback}], remove_system_prompt=True)
                response, mask, log_probs = response + user, mask + [0] * len(user), log_probs + [0.0] * len(user)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask, response_logprobs=log_probs,
                               num_turns=4, reward_score=0.5 if kwargs["index"] % 2 else None,
                               extra_fields={"turn_scores": [float(kwargs["index"])]})


class Failing(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        raise KeyError("answer")


HERE = f"{__name__}"


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tokenizer = build_char_tokenizer()
    model = load_causal_lm(tiny_model_dir, None, dtype=torch.float32)
    engine = NativeRollout(tiny_model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0)
    engine.update_weights(model.named_parameters())
    return tokenizer, model, engine


def batch_of(tokenizer, problems: list[str], names: list[str | None]):
    chats = [[{"role": "user", "content": p}] for p in problems]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in chats]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered], tokenizer.pad_token_id)
    width = 12  # the data's max_prompt_length: wider than these prompts
    ids = torch.cat([torch.full((len(ids), width - ids.shape[1]), tokenizer.pad_token_id), ids], 1)
    mask = torch.cat([torch.zeros(len(ids), width - mask.shape[1], dtype=mask.dtype), mask], 1)
    raw, agent = np.empty(len(chats), dtype=object), np.empty(len(chats), dtype=object)
    raw[:], agent[:] = chats, names
    return ids, mask, {"raw_prompt": raw, "agent_name": agent, "index": np.arange(len(chats))}


def runner(engine, tokenizer, default="two_turn") -> AgentRunner:
    loops = [AgentLoopSpec("two_turn", f"{HERE}.TwoTurnLoop", {"name": "two_turn", "feedback": "again"}),
             AgentLoopSpec("failing", f"{HERE}.Failing", {"name": "failing"})]
    return AgentRunner(engine, tokenizer, compose(["recipe=tiny_cpu"]), loops, default, None, prompt_width=12)


def test_custom_loops_train_on_exactly_the_sampled_ids_batched_into_one_engine_call_per_turn(setup):
    tokenizer, model, engine = setup
    SAMPLED.clear()
    problems = ["12+34=", "5+6=", "77+8=", "1+1=", "9+9=", "40+2="]
    ids, mask, rows = batch_of(tokenizer, problems, ["two_turn", None, "single_turn_agent", "two_turn", None, "two_turn"])
    run = runner(engine, tokenizer)
    sampling = SamplingParams(max_tokens=24, temperature=1.0, stop_token_ids=[tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list("02468"))], seed=3)
    prompts, prompt_mask, out, counters = run.generate_batch(ids, mask, sampling, rows)
    # Five custom rows, two turns each: every turn of all of them went in one engine call, the second reusing the KV.
    assert run.stats["agent/engine_calls"] == 2 and run.stats["agent/requests"] == 10 and run.stats["agent/reused_tokens"] > 0
    assert prompts.shape == (6, 12) and torch.equal(prompts, ids)  # the loops rendered the same prompts, kept at the data's width
    custom = [r for r in range(6) if r != 2]
    for r in custom:  # the trajectory is the server's ids and log-probs, the user turn between them (mask 0)
        first, second = SAMPLED[f"row{r}"]
        user = tokenizer.encode("<|user|>again<|assistant|>", add_special_tokens=False)
        n = len(first.token_ids) + len(user) + len(second.token_ids)
        assert out.responses[r, :n].tolist() == first.token_ids + user + second.token_ids and int(out.response_mask[r].sum()) == n
        assert out.loss_mask[r, :n].tolist() == [1] * len(first.token_ids) + [0] * len(user) + [1] * len(second.token_ids)
        assert out.response_log_probs[r, :n].tolist() == pytest.approx(first.log_probs + [0.0] * len(user) + second.log_probs)
    # ... and those log-probs are the training forward's over the assembled batch (fp32), on every sampled token.
    batch = assemble_sequences(prompts, prompt_mask, out)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
    lp = logits[:, 11:-1].log_softmax(-1).gather(-1, out.responses[..., None]).squeeze(-1)
    sampled = batch["response_mask"].bool()
    torch.testing.assert_close(lp[sampled], batch["rollout_log_probs"][sampled], atol=1e-5, rtol=0)
    # The loops' reward (NaN: compute_score scores the row), turn scores and turns; the built-in rows beside them.
    assert counters["agent_reward"][[1, 3]].tolist() == [0.5, 0.5] and counters["agent_reward"][[0, 2, 4]].isnan().all()
    assert [list(s) for s in counters["turn_scores"]] == [[0.0], [1.0], [], [3.0], [4.0], [5.0]]
    assert counters["num_turns"].tolist() == [4, 4, 0, 4, 4, 4]
    assert out.loss_mask[2].sum() == out.response_mask[2].sum() > 0  # single_turn_agent: one engine call, all sampled


def test_a_failing_loop_or_an_unknown_name_stops_the_step_naming_it(setup):
    tokenizer, _, engine = setup
    ids, mask, rows = batch_of(tokenizer, ["1+1=", "2+2="], ["two_turn", "failing"])
    sampling = SamplingParams(max_tokens=8, stop_token_ids=[tokenizer.eos_token_id])
    with pytest.raises(RuntimeError, match=r"agent loop 'failing' \(.*Failing\) failed on row 1: KeyError: 'answer'"):
        runner(engine, tokenizer).generate_batch(ids, mask, sampling, rows)
    rows["agent_name"][1] = "tool_agnet"
    with pytest.raises(ValueError, match=r"agent_name \['tool_agnet'\] are not agent loops here"):
        runner(engine, tokenizer).generate_batch(ids, mask, sampling, rows)


def test_verls_agent_loop_yaml_loads_and_every_problem_is_reported_at_once(tmp_path):
    good = tmp_path / "loops.yaml"
    good.write_text(f"- name: two\n  _target_: {HERE}.TwoTurnLoop\n  feedback: hm\n")
    assert load_agent_loop_config(str(good)) == [AgentLoopSpec("two", f"{HERE}.TwoTurnLoop", {"name": "two", "feedback": "hm"})]
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent(f"""\
        - name: tool_agent
          _target_: {HERE}.TwoTurnLoop
        - name: a
          _target_: {HERE}.NoSuchLoop
        - name: b
          _target_: rlcore.rollout.agent_loop.Trajectory
        - name: c
          _target_: {HERE}.TwoTurnLoop
        - name: c
          _target_: {HERE}.TwoTurnLoop
        - {HERE}.TwoTurnLoop
    """))
    with pytest.raises(ValueError) as err:
        load_agent_loop_config(str(bad))
    message = str(err.value)
    assert "has 5 problem(s)" in message and "[0].name='tool_agent' is one of rlcore's built-in loops" in message
    assert f"[1]._target_={HERE}.NoSuchLoop" in message and "[2]._target_=rlcore.rollout.agent_loop.Trajectory lacks run" in message
    assert "[4].name='c' repeats [3]'s" in message and "[5] is str, not a mapping" in message
    assert agent_name_problem({"agent_name": "two"}, {"two"}) is None and agent_name_problem({}, {"two"}) is None
    assert "agent_name='tow' is not a loop" in agent_name_problem({"agent_name": "tow"}, {"two", "tool_agent"})
