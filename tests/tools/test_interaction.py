"""Interactions (a simulated user answering the tool agent's turns): verl's lifecycle through the agent loop, the
user turns masked out of the loss, the turn scores per row, the step stopped by a failing interaction with its
name; and verl's interaction-config YAML, checked before Ray starts."""

from __future__ import annotations

import textwrap

import pytest
import torch

from rlcore.config.interaction_config import interaction_name_problem, load_interaction_config
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.reward.scorers import TINY_ADD
from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings, agent_columns, left_pad
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from rlcore.tools.interaction import BaseInteraction, Gsm8kInteraction, build_interactions

EOS = "<|endoftext|>"


class AnswersByPrompt(RolloutEngine):
    """Answers the k-th assistant turn of the conversation that starts with `problem` with `answers[problem][k]` + EOS
    (log-prob -0.5 per token): the row and turn are read from the ids it is given, as a real engine would see them."""

    def __init__(self, tokenizer, answers: dict[str, list[str]]) -> None:
        self.tokenizer, self.answers = tokenizer, answers

    def generate(self, input_ids, attention_mask, sampling):
        ids = []
        for row, mask in zip(input_ids, attention_mask):
            history = self.tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=False)
            problem = next(p for p in self.answers if p in history)
            turn = history.count(EOS)
            ids.append(self.tokenizer.encode(self.answers[problem][turn], add_special_tokens=False) + [self.tokenizer.eos_token_id])
        width = sampling.max_tokens
        pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs])  # noqa: E731
        return RolloutOutput(pad(ids, 0), pad([[-0.5] * len(i) for i in ids], 0.0), pad([[1] * len(i) for i in ids], 0))

    def update_weights(self, weights):
        pass


class NoTools:
    def start(self, tools_kwargs):
        pass

    def execute(self, calls):
        raise AssertionError("no tool is called in these conversations")

    def finish(self):
        pass


class Recording(Gsm8kInteraction):
    """verl's gsm8k interaction on the tiny task, recording its lifecycle."""

    def __init__(self, config):
        super().__init__({"data_source": TINY_ADD, **config})
        self.log: list[tuple] = []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.log.append(("start", kwargs["ground_truth"]))
        return await super().start_interaction(instance_id, **kwargs)

    async def generate_response(self, instance_id, messages, **kwargs):
        self.log.append(("respond", [(m["role"], m["content"]) for m in messages]))
        return await super().generate_response(instance_id, messages, **kwargs)

    async def finalize_interaction(self, instance_id=None, **kwargs):
        self.log.append(("finalize", self.instances[instance_id]["ground_truth"]))
        await super().finalize_interaction(instance_id)


def rows(tokenizer, problems: list[str]):
    chats = [[{"role": "user", "content": p}] for p in problems]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in chats]
    ids, mask = left_pad([list(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered], tokenizer.pad_token_id)
    return ids, mask, chats


def test_the_user_answers_each_turn_until_it_ends_the_episode_and_its_scores_come_back_per_row():
    tokenizer = build_char_tokenizer()
    user = Recording({"name": "tiny_add"})
    engine = AnswersByPrompt(tokenizer, {"1+1=": ["3", "2"], "2+2=": ["4"]})
    loop = AgentLoop(engine, tokenizer, NoTools(), MultiTurnSettings(), interactions={"tiny_add": user})
    ids, mask, chats = rows(tokenizer, ["1+1=", "2+2="])
    kwargs = [{"name": "tiny_add", "ground_truth": "2"}, {"name": "tiny_add", "ground_truth": "4"}]
    out, counters = loop.run(ids, mask, SamplingParams(max_tokens=200, stop_token_ids=[tokenizer.eos_token_id]),
                             interaction_kwargs=kwargs, raw_prompts=chats)
    assert [list(s) for s in counters["turn_scores"]] == [[0.0, 1.0], [1.0]]
    assert counters["num_turns"].tolist() == [2, 1]
    wrong, right = ("<|user|>Your response is incorrect! You need to reflect on your answer and try again.<|assistant|>",
                    "<|user|>Your response is correct!<|assistant|>")
    text = lambda r: tokenizer.decode(out.responses[r, : int(out.response_mask[r].sum())].tolist(), skip_special_tokens=False)  # noqa: E731
    assert text(0) == f"3{EOS}{wrong}2{EOS}{right}" and text(1) == f"4{EOS}{right}"
    # Only the sampled answers (and their EOS) are trained on, with the engine's log-probs; the user's turns are context.
    assert out.loss_mask.sum(-1).tolist() == [4, 2]
    assert torch.equal(out.response_log_probs != 0, out.loss_mask.bool())
    # verl's lifecycle: started with the row's kwargs, shown the conversation (the prompt's messages first), finalized.
    assert user.log[:2] == [("start", "2"), ("start", "4")]
    assert ("respond", [("user", "1+1="), ("assistant", "3"), ("user", wrong[8:-13]), ("assistant", "2")]) in user.log
    assert sorted(e for e in user.log if e[0] == "finalize") == [("finalize", "2"), ("finalize", "4")] and not user.instances


def test_user_turns_count_against_max_user_turns():
    tokenizer = build_char_tokenizer()
    engine = AnswersByPrompt(tokenizer, {"1+1=": ["3", "5", "7", "2"]})
    loop = AgentLoop(engine, tokenizer, NoTools(), MultiTurnSettings(max_user_turns=2),
                     interactions={"tiny_add": Recording({"name": "tiny_add"})})
    ids, mask, _ = rows(tokenizer, ["1+1="])
    _, counters = loop.run(ids, mask, SamplingParams(max_tokens=400, stop_token_ids=[tokenizer.eos_token_id]),
                           interaction_kwargs=[{"name": "tiny_add", "ground_truth": "2"}])
    assert counters["num_turns"].tolist() == [3] and list(counters["turn_scores"][0]) == [0.0, 0.0]


class Broken(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        raise KeyError("ground_truth")


def test_a_failing_interaction_stops_the_step_naming_it_and_an_unknown_name_is_refused():
    tokenizer = build_char_tokenizer()
    engine = AnswersByPrompt(tokenizer, {"1+1=": ["3"]})
    ids, mask, _ = rows(tokenizer, ["1+1="])
    sampling = SamplingParams(max_tokens=50, stop_token_ids=[tokenizer.eos_token_id])
    loop = AgentLoop(engine, tokenizer, NoTools(), MultiTurnSettings(), interactions={"judge": Broken({"name": "judge"})})
    with pytest.raises(RuntimeError, match=r"interaction 'judge' \(.*Broken\)\.generate_response raised KeyError"):
        loop.run(ids, mask, sampling, interaction_kwargs=[{"name": "judge"}])
    with pytest.raises(ValueError, match="interaction_kwargs.name='jduge' is not one of the configured interactions \\(judge\\)"):
        loop.run(ids, mask, sampling, interaction_kwargs=[{"name": "jduge"}])


def test_the_rows_columns_reach_the_agent_loop_from_verls_extra_info():
    import numpy as np

    extra = np.array([{"tools_kwargs": {"t": 1}, "interaction_kwargs": {"name": "a"}}, None], dtype=object)
    raw = np.array([[{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]] + [None], dtype=object)[:2]
    columns = agent_columns({"extra_info": extra, "raw_prompt": raw}, interactions=True)
    assert list(columns["tools_kwargs"]) == [{"t": 1}, {}] and list(columns["interaction_kwargs"]) == [{"name": "a"}, {}]
    assert columns["raw_prompt"] is raw and set(agent_columns({"extra_info": extra}, interactions=False)) == {"tools_kwargs"}


def test_verls_interaction_yaml_loads_and_every_problem_is_reported_at_once(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(textwrap.dedent("""\
        interaction:
          - name: tiny
            class_name: rlcore.tools.interaction.Gsm8kInteraction
            config: {data_source: tiny_add}
          - class_name: rlcore.tools.interaction.Gsm8kInteraction
    """))
    specs = load_interaction_config(str(good))
    assert [(s.name, s.config) for s in specs] == [("tiny", {"data_source": "tiny_add", "name": "tiny"}), ("gsm8k", {"name": "gsm8k"})]
    built = build_interactions(specs)
    assert isinstance(built["tiny"], Gsm8kInteraction) and built["tiny"].name == "tiny" and built["tiny"].data_source == TINY_ADD
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        interaction:
          - name: a
            class_name: rlcore.tools.interaction.BaseInteraction
          - name: z
            class_name: rlcore.tools.interaction.NoSuchInteraction
          - name: b
            class_name: rlcore.tools.builtin.CalculatorTool
            config: [1]
          - name: a
            class_name: rlcore.tools.interaction.BaseInteraction
    """))
    with pytest.raises(ValueError) as err:
        load_interaction_config(str(bad))
    message = str(err.value)
    assert "has 4 problem(s)" in message and "interaction[1].class_name=rlcore.tools.interaction.NoSuchInteraction" in message
    assert "interaction[2].class_name=rlcore.tools.builtin.CalculatorTool lacks start_interaction" in message
    assert "interaction[2].config is list" in message and "interaction[3].name='a' repeats interaction[0]'s" in message
    with pytest.raises(ValueError, match="does not exist"):
        load_interaction_config(str(tmp_path / "none.yaml"))


def test_each_row_must_name_a_configured_interaction():
    names = {"tiny_add"}
    assert interaction_name_problem({"extra_info": {"interaction_kwargs": {"name": "tiny_add"}}}, names) is None
    assert "is missing" in interaction_name_problem({"extra_info": {}}, names)
    assert "'gsm8k' is not in the interaction config (tiny_add)" in interaction_name_problem(
        {"extra_info": {"interaction_kwargs": {"name": "gsm8k"}}}, names)
