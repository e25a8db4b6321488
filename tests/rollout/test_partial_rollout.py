"""Partial rollouts: a weight load while the native engine generates parks the running sequences at a decode step,
rebuilds their KV under the new weights and goes on (rlcore.rollout.base.WeightGate, NativeRollout._rebuild)."""

import threading
import time

import pytest
import torch
from test_agent_loop import every_turn_calls  # noqa: F401  (a fixture)

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.models.random_init import build_model_dir
from rlcore.models.router import ROUTES, Routing, to_routes
from rlcore.rollout.base import Carried, SamplingParams, Until, WeightGate, assemble_sequences
from rlcore.rollout.native import NativeRollout

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)

GREEDY = SamplingParams(max_tokens=12, do_sample=False, stop_token_ids=[20, 21, 22])


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """The tiny model and a second one whose weights differ enough to change greedy tokens and every log-prob."""
    old = load_causal_lm(tiny_model_dir).eval()
    new = load_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for p in new.parameters():
            p.add_(0.2 * p.std().nan_to_num(0.02).clamp(min=0.02) * torch.randn(p.shape, generator=gen))
    return old, new


def prompts(rows: int = 10, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(6, 40, (rows, 5), generator=torch.Generator().manual_seed(seed))
    ids[2, :3] = 0  # left padding
    return ids, (ids != 0).long()


def engine(model_dir: str, weights, **kwargs) -> NativeRollout:
    rollout = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), max_num_seqs=4, **kwargs)  # 10 rows: waves
    with rollout.gate.updating(0):
        rollout.update_weights(weights.named_parameters())
    return rollout


def generate_with_a_load_at(rollout: NativeRollout, decode_call: int, weights, ids, mask, sampling=GREEDY, **kwargs):
    """Generates, and loads `weights` (version 1) from another thread once the engine made `decode_call` decode
    steps: the generation parks at its next step boundary while the load runs."""
    decode, calls = rollout._decode, [0]
    loader = threading.Thread(target=lambda: load(rollout, weights))

    def counting_decode(*args):
        calls[0] += 1
        if calls[0] == decode_call:
            loader.start()
            while not rollout.gate.pending:  # the load waits for this step: the loop parks right after it
                time.sleep(0.001)
        return decode(*args)

    rollout._decode = counting_decode
    try:
        out = rollout.generate(ids, mask, sampling, **kwargs)
    finally:
        rollout._decode = decode
    loader.join()
    return out


def load(rollout: NativeRollout, weights) -> None:
    with rollout.gate.updating(1):
        rollout.update_weights(weights.named_parameters())


def model_log_probs(model, ids, mask, out, width: int) -> torch.Tensor:
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    return gather_log_probs(response_logits(logits, width), out.responses) * out.response_mask


@pytest.mark.parametrize("check_every", [1, 3])
def test_loading_the_same_weights_mid_generation_changes_nothing_but_the_versions(tiny_model_dir, models, check_every):
    """The KV rebuilt from prompt + tokens so far equals the KV decoded step by step; rows are versioned by the loads
    they saw: (0, 0) finished before it, (0, 1) running across it, (1, 1) admitted after it. With check_every 3
    (CUDA's lag), rows that finished unnoticed are dropped before the rebuild, not resumed."""
    old, _ = models
    ids, mask = prompts()
    plain, parted = engine(tiny_model_dir, old), engine(tiny_model_dir, old)
    plain.finish_check_every = parted.finish_check_every = check_every
    expected = plain.generate(ids, mask, GREEDY)
    out = generate_with_a_load_at(parted, 5, old, ids, mask)
    assert torch.equal(out.responses, expected.responses) and torch.equal(out.response_mask, expected.response_mask)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-5, rtol=1e-5)
    kinds = {tuple(v) for v in out.versions.tolist()}
    assert kinds == {(0, 1), (1, 1)} or kinds == {(0, 0), (0, 1), (1, 1)}, kinds
    assert parted.stats["resumed_rows"] == sum(v == [0, 1] for v in out.versions.tolist()) == 4  # the first wave
    assert parted.stats["rebuilt_tokens"] == 4 * 5 + 4 * 5 - 3  # prompts (one padded by 3) + 5 tokens each
    assert expected.versions.tolist() == [[0, 0]] * 10  # no load: version 0 throughout


def test_resumed_rows_take_each_token_from_the_weights_loaded_when_it_was_sampled(tiny_model_dir, models):
    """Under other weights, a row running across the load has its first tokens (and their log-probs) from the old
    weights and the rest from the new ones, computed over the whole sequence so far: the new weights' forward of
    prompt + response gives exactly the resumed tokens' log-probs. Sampled at temperature 0.8 too."""
    old, new = models
    ids, mask = prompts()
    for sampling in (GREEDY, SamplingParams(max_tokens=12, temperature=0.8, stop_token_ids=[20], seed=4)):
        out = generate_with_a_load_at(engine(tiny_model_dir, old), 5, new, ids, mask, sampling)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        lp = {}
        for name, model in (("old", old), ("new", new)):
            seq = assemble_sequences(ids, mask, out)
            with torch.no_grad():
                logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
            lp[name] = gather_log_probs(response_logits(logits, 12, temperature=temperature), out.responses) * out.response_mask
        for row, (start, end) in enumerate(out.versions.tolist()):
            n = int(out.response_mask[row].sum())
            got = out.response_log_probs[row, :n]
            if (start, end) == (0, 1):  # the first wave had sampled 5 tokens at the load
                cut = 5
            else:
                cut = n if start == 0 else 0
            torch.testing.assert_close(got[:cut], lp["old"][row, :cut], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[cut:], lp["new"][row, cut:n], atol=1e-5, rtol=1e-5)
            if cut < n:  # the new weights really differ here: the old ones give other log-probs
                assert not torch.allclose(got[cut:], lp["old"][row, cut:n], atol=1e-3)
        assert {tuple(v) for v in out.versions.tolist()} >= {(0, 1), (1, 1)}


def test_a_mixture_of_experts_resumed_rows_carry_the_routes_of_the_weights_that_rebuilt_their_kv(tmp_path):
    """R3 with partial rollouts: a row running across the load had its prompt and tokens so far recomputed under the
    new weights, and every later token attends to that KV: its recorded routes are the new weights' at every
    position. A row that finished before the load keeps the old weights' routes."""
    moe_dir = build_model_dir(str(tmp_path / "moe"), "tiny-qwen3-moe", build_char_tokenizer())
    old, new = load_causal_lm(moe_dir).eval(), load_causal_lm(moe_dir).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ids, mask = prompts()
    out = generate_with_a_load_at(engine(moe_dir, old, record_routes=True), 5, new, ids, mask)
    seq = assemble_sequences(ids, mask, out)
    expected = {}
    for name, model in (("old", old), ("new", new)):
        routing = Routing(model)
        with torch.no_grad(), routing.run(record=True) as p:
            model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"])
        expected[name] = to_routes(p.recorded, routing.num_layers).view(*seq["input_ids"].shape, routing.num_layers, routing.top_k)
    decides = seq["attention_mask"].bool().clone()
    decides[torch.arange(len(decides)), decides.shape[1] - 1 - decides.flip(-1).int().argmax(-1)] = False
    versions = [tuple(v) for v in out.versions.tolist()]
    assert (0, 1) in versions
    for row, version in enumerate(versions):
        weights = "old" if version == (0, 0) else "new"
        assert torch.equal(seq[ROUTES][row][decides[row]], expected[weights][row][decides[row]]), (row, version)
    resumed = [row for row, v in enumerate(versions) if v == (0, 1)]
    assert any(not torch.equal(expected["old"][r][decides[r]], expected["new"][r][decides[r]]) for r in resumed)


def test_kv_kept_for_the_next_turn_is_dropped_when_the_weights_change(tiny_model_dir, models):
    """Multi-turn: a turn reuses the KV kept from the last one, unless a load came between them (that KV is the old
    weights'): then the rows are prefilled whole, and the turn equals one under the new weights from scratch."""
    old, new = models
    ids, mask = prompts(rows=4)
    first_turn = SamplingParams(max_tokens=4, do_sample=False)
    rollout = engine(tiny_model_dir, old)
    out = rollout.generate(ids, mask, first_turn, keep_kv=True)
    history = torch.cat([ids, out.responses], -1)
    history_mask = torch.cat([mask, out.response_mask], -1)
    again = rollout.generate(history, history_mask, first_turn, keep_kv=True, prefix_of=list(range(4)))
    assert rollout.stats["reused_tokens"] > 0  # same weights: the kept KV serves
    rollout.generate(ids, mask, first_turn, keep_kv=True)
    load(rollout, new)
    after = rollout.generate(history, history_mask, first_turn, keep_kv=True, prefix_of=list(range(4)))
    assert rollout.stats["reused_tokens"] == 0 and after.versions.tolist() == [[1, 1]] * 4
    fresh = engine(tiny_model_dir, new).generate(history, history_mask, first_turn)
    assert torch.equal(after.responses, fresh.responses) and not torch.equal(after.responses, again.responses)
    torch.testing.assert_close(after.response_log_probs, fresh.response_log_probs, atol=1e-5, rtol=1e-5)


def test_a_load_waits_for_a_call_that_cannot_park_and_new_calls_wait_for_the_load():
    """vLLM's calls cannot park: the load starts when the call ends. A call that begins while a load waits or runs
    starts after it, with the new version."""
    gate, events = WeightGate(), []

    def call(name: str, seconds: float) -> None:
        with gate.generating():
            events.append((name, "start", gate.version))
            time.sleep(seconds)
            events.append((name, "end", gate.version))

    def update() -> None:
        with gate.updating(7):
            events.append(("load", "start", None))
            time.sleep(0.1)
            events.append(("load", "end", None))

    first = threading.Thread(target=call, args=("first", 0.3))
    first.start()
    time.sleep(0.05)
    loader = threading.Thread(target=update)
    loader.start()
    time.sleep(0.05)
    second = threading.Thread(target=call, args=("second", 0.0))
    second.start()
    for t in (first, loader, second):
        t.join()
    assert events == [("first", "start", None), ("first", "end", None), ("load", "start", None), ("load", "end", None),
                      ("second", "start", 7), ("second", "end", 7)]


def test_a_failed_load_keeps_the_version_and_frees_the_gate():
    gate = WeightGate()
    with pytest.raises(RuntimeError):
        with gate.updating(3):
            raise RuntimeError("the trainer died mid-stream")
    assert gate.version is None and not gate.pending
    with gate.generating():
        assert gate.active == 1


def test_multi_turn_trajectories_record_a_load_between_turns_and_use_the_new_weights_after_it(tiny_model_dir, models, every_turn_calls):  # noqa: F811
    """A sync while tools run (between two turns): the next turn prefills its history under the new weights (the
    kept KV is the old weights'), and each trajectory's versions span the load. Every sampled token's log-prob is
    its own turn's weights': turn 1 the old ones, later turns the new ones (fp32, 1e-5)."""
    from test_agent_loop import EchoTools, stop_ids
    from test_agent_loop import prompts as chat_prompts

    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings

    old, new = models
    tokenizer = build_char_tokenizer()
    rollout = NativeRollout(tiny_model_dir, tokenizer.pad_token_id, torch.device("cpu"), seed=0)
    with rollout.gate.updating(0):
        rollout.update_weights(old.named_parameters())

    class LoadingTools(EchoTools):
        def execute(self, calls):
            if not self.calls:  # the first tool wave: the trainer's sync lands now
                load(rollout, new)
            return super().execute(calls)

    ids, mask = chat_prompts(tokenizer, ("12+34=", "5+67=", "99+1="), 2)
    sampling = SamplingParams(max_tokens=96, temperature=1.0, stop_token_ids=stop_ids(tokenizer), seed=5)
    out, counters = AgentLoop(rollout, tokenizer, LoadingTools(), MultiTurnSettings(format="every_turn")).run(ids, mask, sampling)
    assert rollout.stats["reused_tokens"] > 0  # turns after the second reuse the KV kept under the new weights
    versions = out.versions.tolist()
    one_turn = (counters["num_turns"] == 1).tolist()
    assert all(v == ([0, 0] if single else [0, 1]) for v, single in zip(versions, one_turn)) and not all(one_turn)
    seq = assemble_sequences(ids, mask, out)
    lp = {}
    for name, model in (("old", old), ("new", new)):
        with torch.no_grad():
            logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
        lp[name] = gather_log_probs(response_logits(logits, out.responses.shape[1]), out.responses)
    for row in range(len(ids)):
        sampled = out.loss_mask[row].bool()
        first_turn = int(sampled.long().cumprod(0).sum())  # the sampled run before the first tool response
        got = out.response_log_probs[row]
        torch.testing.assert_close(got[:first_turn], lp["old"][row, :first_turn], atol=1e-5, rtol=0)
        later = sampled.clone()
        later[:first_turn] = False
        torch.testing.assert_close(got[later], lp["new"][row][later], atol=1e-5, rtol=0)


def grouped_prompts(groups: int = 6, n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = prompts(groups)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)


def test_a_call_ended_part_way_and_carried_on_equals_one_uninterrupted_call(tiny_model_dir, models):
    """colocate_async's engine side: `until` ends the call once enough whole groups finished (the first `first` among
    them), the others part-way with their tokens so far; handed back as `carried`, they go on from there (their KV
    rebuilt) and, under the same weights, end exactly as one call would have: same tokens, same log-probs."""
    old, _ = models
    ids, mask = grouped_prompts()
    rollout = engine(tiny_model_dir, old)
    full = rollout.generate(ids, mask, GREEDY)
    part = rollout.generate(ids, mask, GREEDY, until=Until(2))
    done = part.finished.view(-1, 2).all(1)
    assert int(done.sum()) >= 2 and not part.finished.all()
    lengths, full_lengths = part.response_mask.sum(-1), full.response_mask.sum(-1)
    assert torch.equal(lengths[part.finished], full_lengths[part.finished]) and (lengths[~part.finished] < full_lengths[~part.finished]).all()
    assert torch.equal(part.responses * part.response_mask, full.responses * part.response_mask)  # a prefix of the full call
    rest = rollout.generate(ids, mask, GREEDY, carried=Carried.of(part))
    assert rest.finished.all() and torch.equal(rest.responses, full.responses) and torch.equal(rest.response_mask, full.response_mask)
    torch.testing.assert_close(rest.response_log_probs, full.response_log_probs, atol=1e-5, rtol=1e-5)
    assert rollout.stats["resumed_rows"] == int(((lengths > 0) & ~part.finished).sum())  # the rest started afresh
    first = rollout.generate(ids, mask, GREEDY, until=Until(1, first=4))
    assert first.finished.view(-1, 2)[:4].all()  # the first four groups had to finish


def test_carried_rows_go_on_under_the_weights_loaded_since(tiny_model_dir, models):
    """A row carried across a weight load keeps its first tokens (and their log-probs) from the old weights and takes
    the rest from the new ones, computed over the whole sequence so far."""
    old, new = models
    ids, mask = grouped_prompts()
    rollout = engine(tiny_model_dir, old)
    part = rollout.generate(ids, mask, GREEDY, until=Until(2))
    load(rollout, new)
    out = rollout.generate(ids, mask, GREEDY, carried=Carried.of(part))
    lp_old, lp_new = model_log_probs(old, ids, mask, out, 12), model_log_probs(new, ids, mask, out, 12)
    resumed = 0
    for row, cut in enumerate(part.response_mask.sum(-1).tolist()):
        length = int(out.response_mask[row].sum())
        torch.testing.assert_close(out.response_log_probs[row, :cut], lp_old[row, :cut], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.response_log_probs[row, cut:length], lp_new[row, cut:length], atol=1e-5, rtol=1e-5)
        if cut < length:  # the new weights really differ here: the old ones give other log-probs
            resumed += not torch.allclose(out.response_log_probs[row, cut:length], lp_old[row, cut:length], atol=1e-3)
    assert resumed >= 4 and out.finished.all()
    assert torch.equal(out.responses[part.finished], part.responses[part.finished])  # finished rows pass through
