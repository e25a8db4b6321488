"""The static (graph-capturable) decode step equals the eager one, its buckets, its invalidation and its safety net.

On CPU the static step runs eagerly (`capture=False`): the maths and bookkeeping the CUDA graphs replay, minus the
capture itself (tests/gpu/test_rollout_graphs.py covers that)."""

import pytest
import torch
from conftest import build_tiny_llama_dir

from rlcore.models.hf import load_causal_lm
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.graphs import DecodeGraphs, default_capture_sizes
from rlcore.rollout.native import NativeRollout

pytestmark = pytest.mark.numerics

SIZES = [1, 2, 4, 8, 16]


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3"])
def model_dir(request, tiny_model_dir, tmp_path_factory):
    """All GQA: qwen2 2 query heads per KV head with q/k/v biases, llama 4 per KV head and a tied head, qwen3 q/k norms."""
    if request.param == "qwen3":
        from rlcore.data.tokenizer import build_char_tokenizer
        from rlcore.models.random_init import build_model_dir

        return build_model_dir(str(tmp_path_factory.mktemp("qwen3")), "tiny-qwen3", build_char_tokenizer())
    return tiny_model_dir if request.param == "qwen2" else build_tiny_llama_dir(str(tmp_path_factory.mktemp("llama")))


def engine(model_dir: str, static: bool, max_num_seqs: int = 12, capture_after: int = 1) -> NativeRollout:
    """`capture_after=1`: every bucket is captured at first use (the engine's default rides larger ones first)."""
    rollout = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"), max_num_seqs=max_num_seqs)
    rollout.update_weights(load_causal_lm(model_dir).named_parameters())
    if static:
        # Key lengths in blocks of 4 (256 on CUDA): the tiny slots of 18 positions see several key-length buckets.
        rollout.graphs = DecodeGraphs(rollout.decoder, rollout.pool, rollout.model.config.vocab_size, SIZES, capture=False, kv_block=4,
                                      capture_after=capture_after)
    return rollout


def batch(groups: int = 5, n: int = 4, prompt_len: int = 6):
    """`groups` prompts (some left-padded) x n samples: 20 rows through 12 slots, so groups wait, join and leave."""
    prompts = torch.randint(6, 40, (groups, prompt_len), generator=torch.Generator().manual_seed(1))
    prompts[1, :2] = 0
    prompts[3, :4] = 0
    return prompts.repeat_interleave(n, 0), (prompts != 0).long().repeat_interleave(n, 0)


# Stop tokens hit often: rows leave at every few steps, so the running batch is compacted and shrinks through buckets.
SAMPLING = SamplingParams(max_tokens=12, temperature=1.0, stop_token_ids=list(range(6, 16)), seed=3)


def test_static_decode_gives_the_eager_tokens_and_log_probs(model_dir):
    ids, mask = batch()
    eager = engine(model_dir, static=False).generate(ids, mask, SAMPLING)
    static = engine(model_dir, static=True)
    static.graphs.check_first_replay = False  # every decode step below is the static one
    out = static.generate(ids, mask, SAMPLING)
    assert not static.graphs.disabled
    keys = static.graphs.graphs  # it ran at several batch sizes and several key lengths
    assert len({size for size, _ in keys}) >= 3 and len({kv for _, kv in keys}) >= 3, sorted(keys)
    assert torch.equal(out.responses, eager.responses) and torch.equal(out.response_mask, eager.response_mask)
    torch.testing.assert_close(out.response_log_probs, eager.response_log_probs, atol=1e-5, rtol=1e-5)
    lengths = eager.response_mask.sum(-1)
    assert lengths.min() < lengths.max() and lengths.max() > 3  # rows did leave at different steps


def test_first_use_check_passes_and_greedy_matches(model_dir):
    ids, mask = batch()
    greedy = SamplingParams(max_tokens=10, do_sample=False, stop_token_ids=[20])
    static = engine(model_dir, static=True)
    out = static.generate(ids, mask, greedy)
    assert static.graphs.verified and not static.graphs.disabled
    expected = engine(model_dir, static=False).generate(ids, mask, greedy)
    assert torch.equal(out.responses, expected.responses)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-5, rtol=1e-5)


def test_a_bucket_rides_a_larger_captured_one_until_it_was_needed_capture_after_steps(model_dir):
    """The rent-or-buy rule (graphs.py's docstring): the shrinking batch replays the least captured bucket holding it,
    and a bucket is captured on its third step; the tokens are the eager decode's."""
    ids, mask = batch()
    static = engine(model_dir, static=True, capture_after=3)
    graphs, needed_keys, replayed = static.graphs, [], []
    choose = graphs._replayed

    def spy(key):
        needed_keys.append(key)
        replayed.append(choose(key))
        return replayed[-1]

    graphs._replayed = spy
    out = static.generate(ids, mask, SAMPLING)
    captured, seen = set(), {}
    for key, played in zip(needed_keys, replayed):  # each step's choice, replayed against the rule
        seen[key] = seen.get(key, 0) + 1
        holders = [c for c in captured if c[0] >= key[0] and c[1] >= key[1]]
        if key in captured or not holders or seen[key] >= 3:
            assert played == key
        else:
            assert played == min(holders, key=lambda c: (c[0] * c[1], c)), (key, played, holders)
        captured.add(played)
    assert captured == set(graphs.graphs) and len(captured) < len(seen)  # fewer captures than buckets needed
    assert any(played != key for key, played in zip(needed_keys, replayed))  # some steps rode a larger bucket
    assert static.stats["graph_captures"] == len(graphs.graphs)
    assert static.stats["graph_capture_s"] > 0  # host seconds capturing and checking
    expected = engine(model_dir, static=False).generate(ids, mask, SAMPLING)
    assert torch.equal(out.responses, expected.responses)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-5, rtol=1e-5)


def test_buckets():
    assert default_capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24] and default_capture_sizes(256)[-1] == 256
    assert len(default_capture_sizes(256)) == 35  # 1, 2, 4 and 32 multiples of 8
    assert default_capture_sizes(6) == [1, 2, 4, 6] and default_capture_sizes(1) == [1] and default_capture_sizes(8) == [1, 2, 4, 8]

    class Pool:
        num_slots, max_len = 12, 600

    graphs = DecodeGraphs(None, Pool(), 10, SIZES, capture=False)
    assert [graphs.kv_bucket(n) for n in (1, 256, 257, 512, 599)] == [256, 256, 512, 512, 600]  # blocks of 256, clamped
    assert [graphs.bucket(rows) for rows in (1, 2, 3, 5, 8, 9, 12)] == [1, 2, 4, 8, 8, 12, 12]  # 16 clamps to the pool
    graphs.sizes = [1, 2, 4]
    assert graphs.bucket(4) == 4 and graphs.bucket(5) is None  # above the largest size: eager


def test_a_new_pool_drops_the_graphs_and_the_same_pool_keeps_them(model_dir):
    ids, mask = batch(groups=4, n=1)
    static = engine(model_dir, static=True)
    static.generate(ids, mask, SamplingParams(max_tokens=4, do_sample=False))
    graphs = static.graphs
    kept = dict(graphs.graphs)
    assert kept and graphs.out.shape[0] == static.pool.num_slots == 4
    assert static.stats["graph_captures"] == len(kept)
    static.generate(ids, mask, SamplingParams(max_tokens=4, do_sample=False))  # the pool is kept: same graphs
    assert static.stats["graph_captures"] == 0
    assert all(graphs.graphs[size] is replay for size, replay in kept.items())
    static.sleep(level=1)  # the KV cache only: the weights stay
    assert graphs.graphs == {} and graphs.verified == set() and graphs.out is None
    static.pool.acquire(6, 32)  # another shape, as wake_up with another budget would allocate
    graphs._follow_pool()
    assert graphs.graphs == {} and graphs.out.shape[0] == 6 and graphs.token.shape[0] == 6
    out = static.generate(ids, mask, SamplingParams(max_tokens=4, do_sample=False))
    expected = engine(model_dir, static=False).generate(ids, mask, SamplingParams(max_tokens=4, do_sample=False))
    assert torch.equal(out.responses, expected.responses) and graphs.graphs


def test_a_capture_failure_warns_once_and_decodes_eagerly(model_dir, monkeypatch):
    def broken(self, size, kv_len):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraphs, "_capture", broken)
    ids, mask = batch()
    static = engine(model_dir, static=True)
    with pytest.warns(RuntimeWarning, match="raised RuntimeError") as caught:
        out = static.generate(ids, mask, SAMPLING)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1 and static.graphs.disabled
    expected = engine(model_dir, static=False).generate(ids, mask, SAMPLING)
    assert torch.equal(out.responses, expected.responses)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-6, rtol=1e-6)


def test_a_replay_that_differs_from_eager_warns_and_decodes_eagerly(model_dir, monkeypatch):
    def wrong(self, size, kv_len):
        return lambda: self.out[:size].fill_(3.0)  # a graph that replays something else

    monkeypatch.setattr(DecodeGraphs, "_capture", wrong)
    ids, mask = batch()
    static = engine(model_dir, static=True)
    with pytest.warns(RuntimeWarning, match="differs from the eager decode"):
        out = static.generate(ids, mask, SAMPLING)
    assert static.graphs.disabled and not static.graphs.verified
    expected = engine(model_dir, static=False).generate(ids, mask, SAMPLING)
    assert torch.equal(out.responses, expected.responses)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-6, rtol=1e-6)


def test_graphs_only_on_cuda_and_not_when_eager_is_enforced(tiny_model_dir):
    assert NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu")).graphs is None
    model = load_causal_lm(tiny_model_dir)
    assert NativeRollout(None, pad_token_id=0, device=torch.device("cpu"), model=model).decoder is None  # a model passed in


def test_static_decode_with_a_lagged_finish_check_as_on_cuda(model_dir):
    """CUDA's combination: graphs, and finished rows decoding on (to their slot's last position) until the next check."""
    ids, mask = batch()
    greedy = SamplingParams(max_tokens=12, do_sample=False, stop_token_ids=list(range(6, 16)))
    static = engine(model_dir, static=True)
    static.graphs.check_first_replay = False
    static.finish_check_every = 4
    out = static.generate(ids, mask, greedy)
    expected = engine(model_dir, static=False).generate(ids, mask, greedy)
    assert not static.graphs.disabled and torch.equal(out.responses, expected.responses)
    torch.testing.assert_close(out.response_log_probs, expected.response_log_probs, atol=1e-5, rtol=1e-5)
