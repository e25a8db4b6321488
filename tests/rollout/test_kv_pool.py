"""Continuous batching over the native engine's KV pool: a queue longer than the pool gives the same sequences,
budgets size the pool, sleep() frees it."""

import inspect

import pytest
import torch
from conftest import build_tiny_llama_dir

from rlcore.models.hf import load_causal_lm
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.kv_pool import ATTENTION_NAME, KVGeometry, KVPool, SlotCache, cache_keyword, decode_mask, prefill_mask
from rlcore.rollout.native import NativeRollout

pytestmark = pytest.mark.numerics

EOS = 20


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir).eval()


def engine(tiny_model_dir, model, **kwargs) -> NativeRollout:
    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu"), seed=0, **kwargs)
    rollout.update_weights(model.state_dict().items())
    return rollout


def grouped_prompts(groups: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(6, 40, (groups, 6), generator=g)
    for i in range(groups):
        ids[i, : i % 4] = 0  # uneven left padding
    return ids.repeat_interleave(n, 0), (ids != 0).long().repeat_interleave(n, 0)


def _positional(fn) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [name for name, p in inspect.signature(fn).parameters.items() if p.kind in kinds]


def test_slot_cache_takes_the_arguments_of_hf_cache_update():
    """HF's attention modules call their cache by `transformers.cache_utils.Cache.update`'s contract, which moved in
    5.24 (`kwargs=` instead of a positional `cache_kwargs`). When it moves again, this test names the change before a
    rollout meets it: update `SlotCache.update` (rlcore/rollout/kv_pool.py) to the new contract."""
    from transformers.cache_utils import Cache

    assert _positional(Cache.update) == _positional(SlotCache.update) == ["self", "key_states", "value_states", "layer_idx"], (
        f"HF's Cache.update is now {inspect.signature(Cache.update)}; SlotCache.update is {inspect.signature(SlotCache.update)}")
    kinds = {p.kind for p in inspect.signature(SlotCache.update).parameters.values()}
    assert {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds  # whatever HF adds after layer_idx


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3"])
def family_model(request, tiny_model_dir, tmp_path_factory):
    if request.param == "qwen3":
        from rlcore.data.tokenizer import build_char_tokenizer
        from rlcore.models.random_init import build_model_dir

        path = build_model_dir(str(tmp_path_factory.mktemp("qwen3")), "tiny-qwen3", build_char_tokenizer())
    else:
        path = tiny_model_dir if request.param == "qwen2" else build_tiny_llama_dir(str(tmp_path_factory.mktemp("llama")))
    return load_causal_lm(path).eval()


def test_hf_modules_prefill_and_decode_through_a_slot_cache_as_one_full_forward(family_model):
    """The installed transformers' own attention modules (the native engine's unfused path): a prefill into the pool
    then one decode step through `SlotCache` give the logits of one forward over the whole sequence, per family."""
    model, ids = family_model, torch.tensor([[0, 0, 7, 9, 11, 13], [5, 6, 8, 10, 12, 14]])
    start = (ids == 0).sum(1)
    pool = KVPool(KVGeometry.of(model, torch.float32), torch.device("cpu"))
    pool.acquire(2, 8)
    pool.start[:] = start
    attention, model.config._attn_implementation = model.config._attn_implementation, ATTENTION_NAME
    try:
        with torch.no_grad():
            prefill = SlotCache(pool, 0, 2, positions=0, kv_len=5)
            positions = (torch.arange(5) - start[:, None]).clamp(min=0)
            model(input_ids=ids[:, :5], attention_mask=prefill_mask(start, 5), position_ids=positions, use_cache=True,
                  **{cache_keyword(model): prefill})
            pos = torch.tensor([5, 5])
            step = SlotCache(pool, 0, 2, positions=pos, kv_len=6)
            decoded = model(input_ids=ids[:, 5:], attention_mask=decode_mask(start, pos, 6), position_ids=(pos - start)[:, None],
                            use_cache=True, **{cache_keyword(model): step}).logits[:, -1]
    finally:
        model.config._attn_implementation = attention
    mask = (ids != 0).long()
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0), use_cache=False).logits[:, -1]
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=1e-5)


def test_masks_by_hand():
    start = torch.tensor([0, 2])
    m = prefill_mask(start, 3)[:, 0].int().tolist()
    assert m[0] == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert m[1] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]  # padding queries see only themselves; the real one skips them
    d = decode_mask(torch.tensor([1, 0]), torch.tensor([3, 1]), 5)[:, 0, 0].int().tolist()
    assert d == [[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]]


def test_pool_bytes_are_keys_and_values_of_every_layer(tiny_model_dir, model):
    rollout = engine(tiny_model_dir, model)
    c = model.config
    geometry = KVGeometry.of(model, torch.float32)
    assert geometry.bytes_per_token == 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    ids, mask = grouped_prompts(3, 2)
    rollout.generate(ids, mask, SamplingParams(max_tokens=5, stop_token_ids=[EOS], seed=0))
    assert rollout.pool.nbytes == 6 * (6 + 5) * geometry.bytes_per_token  # one slot per row, prompt + response long
    rollout.sleep(level=1)
    assert rollout.pool.nbytes == 0 and rollout.pool.keys == []
    rollout.generate(ids, mask, SamplingParams(max_tokens=5, stop_token_ids=[EOS], seed=0))  # wakes by itself
    assert rollout.pool.nbytes > 0


def test_a_queue_longer_than_max_num_seqs_decodes_the_same_sequences(tiny_model_dir, model):
    """16 rows (4 prompts x 4 samples) through 8 slots: groups wait, join as a whole group's slots free up."""
    ids, mask = grouped_prompts(4, 4)
    greedy = SamplingParams(max_tokens=10, do_sample=False, stop_token_ids=[EOS])
    everyone = engine(tiny_model_dir, model).generate(ids, mask, greedy)
    queued_engine = engine(tiny_model_dir, model, max_num_seqs=8)
    queued = queued_engine.generate(ids, mask, greedy)
    assert torch.equal(queued.responses, everyone.responses)
    torch.testing.assert_close(queued.response_log_probs, everyone.response_log_probs, atol=1e-5, rtol=1e-5)
    assert queued_engine.stats["kv_slots"] == 8 and queued_engine.stats["peak_running"] == 8
    assert queued_engine.stats["prefills"] >= 2

    sampled = queued_engine.generate(ids, mask, SamplingParams(max_tokens=10, stop_token_ids=list(range(6, 30)), seed=5))  # stops often
    lengths = sampled.response_mask.sum(-1)
    assert lengths.min() < lengths.max()  # rows left at different steps while others waited
    seq = assemble_sequences(ids, mask, sampled)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    train_lp = gather_log_probs(response_logits(logits, 10), sampled.responses) * sampled.response_mask
    torch.testing.assert_close(train_lp, sampled.response_log_probs, atol=1e-5, rtol=1e-5)


def test_prefill_token_budget_admits_one_prompt_at_a_time(tiny_model_dir, model):
    ids, mask = grouped_prompts(3, 2)
    rollout = engine(tiny_model_dir, model, max_num_batched_tokens=6)  # one 6-token prompt per prefill
    rollout.generate(ids, mask, SamplingParams(max_tokens=4, stop_token_ids=[EOS], seed=0))
    assert rollout.stats["prefills"] == 3 and rollout.stats["kv_slots"] == 6


def test_kv_budget_sizes_the_pool_and_too_small_a_budget_names_the_keys(tiny_model_dir, model):
    ids, mask = grouped_prompts(3, 4)
    per_sequence = KVGeometry.of(model, torch.float32).bytes_per_token * (6 + 8)
    sp = SamplingParams(max_tokens=8, do_sample=False, stop_token_ids=[EOS])
    rollout = engine(tiny_model_dir, model, kv_cache_memory_bytes=5 * per_sequence + per_sequence // 2)
    out = rollout.generate(ids, mask, sp)
    assert rollout.stats["kv_slots"] == 5 and rollout.stats["prefills"] == 3  # one group of 4 at a time
    assert torch.equal(out.responses, engine(tiny_model_dir, model).generate(ids, mask, sp).responses)
    with pytest.raises(ValueError, match="fewer than the 4 samples.*max_num_seqs.*kv_cache_memory_bytes"):
        engine(tiny_model_dir, model, kv_cache_memory_bytes=3 * per_sequence).generate(ids, mask, sp)


def test_a_fresh_pool_is_zeroed(tiny_model_dir, model):
    """Rows attend over a view that includes other rows' longer tails and left padding (masked: weight 0). The pool
    is allocated zeroed, because 0 x NaN from uninitialised memory is NaN: with torch.empty, greedy rows of a later
    group came out different depending on which tests ran before in the process."""
    rollout = engine(tiny_model_dir, model)
    for _ in range(2):
        torch.full((8, 4, 64, 64), float("nan")).sum()  # leave NaN pages in the allocator's free lists
        rollout.pool.acquire(8, 64)
        assert all(bool((cache == 0).all()) for cache in (*rollout.pool.keys, *rollout.pool.values))
        rollout.pool.release()


def test_with_a_budget_wake_up_allocates_the_pool_and_generate_uses_it(tiny_model_dir, model):
    per_token = KVGeometry.of(model, torch.float32).bytes_per_token
    rollout = engine(tiny_model_dir, model, max_num_seqs=16, max_model_len=20, kv_cache_memory_bytes=12 * 20 * per_token)
    rollout.wake_up(["kv_cache"])
    assert (rollout.pool.num_slots, rollout.pool.max_len) == (12, 20)  # the budget holds 12 of the 16 sequences
    segment = rollout.pool.keys[0].data_ptr()
    ids, mask = grouped_prompts(4, 4)
    out = rollout.generate(ids, mask, SamplingParams(max_tokens=8, do_sample=False, stop_token_ids=[EOS]))
    assert rollout.pool.keys[0].data_ptr() == segment and rollout.stats["kv_slots"] == 12
    assert torch.equal(out.responses, engine(tiny_model_dir, model).generate(
        ids, mask, SamplingParams(max_tokens=8, do_sample=False, stop_token_ids=[EOS])).responses)
    rollout.sleep()
    assert rollout.pool.nbytes == 0
    no_budget = engine(tiny_model_dir, model, max_model_len=20)
    no_budget.wake_up(["kv_cache"])
    assert no_budget.pool.nbytes == 0  # CPU without a budget: sized by each generate() instead
