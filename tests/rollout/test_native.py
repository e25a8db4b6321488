import pytest
import torch

from rlcore.models.hf import load_causal_lm
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.native import NativeRollout, filter_logits

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)


@pytest.fixture(scope="module")
def engine_and_model(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir).eval()
    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu"), seed=0)
    rollout.update_weights(model.state_dict().items())
    return rollout, model


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2, top_p=1.0)).tolist() == [[False, False, True, True]]
    # top_p=0.7: 0.5 alone < 0.7, so 0.3 is kept too; 0.15 starts after 0.8 mass.
    assert torch.isinf(filter_logits(logits, top_k=-1, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_k=-1, top_p=0.01)).tolist() == [[False, True, True, True]]


def test_left_padding_is_invisible_and_log_probs_match_training_forward(engine_and_model):
    rollout, model = engine_and_model
    ids = torch.tensor([[0, 0, 7, 8, 9], [10, 11, 12, 13, 14]])
    mask = (ids != 0).long()
    greedy = SamplingParams(max_tokens=6, do_sample=False, stop_token_ids=[1])
    out = rollout.generate(ids, mask, greedy)
    alone = rollout.generate(ids[:1, 2:], mask[:1, 2:], greedy)
    assert torch.equal(out.responses[0], alone.responses[0])
    torch.testing.assert_close(out.response_log_probs[0], alone.response_log_probs[0], atol=1e-5, rtol=1e-5)
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    train_lp = gather_log_probs(response_logits(logits, 6), out.responses) * out.response_mask
    torch.testing.assert_close(train_lp, out.response_log_probs, atol=1e-5, rtol=1e-5)


def test_sampling_stops_at_eos_pads_after_and_is_seeded(engine_and_model):
    rollout, _ = engine_and_model
    ids = torch.randint(6, 40, (64, 4))
    mask = torch.ones_like(ids)
    eos = 20
    sp = SamplingParams(max_tokens=8, temperature=1.0, stop_token_ids=[eos], seed=123)
    out = rollout.generate(ids, mask, sp)
    for row, row_mask in zip(out.responses, out.response_mask):
        n = int(row_mask.sum())
        assert (row[n:] == 0).all()  # pad after the end
        hits = (row[:n] == eos).nonzero()
        assert len(hits) == 0 or (len(hits) == 1 and hits[0].item() == n - 1)  # EOS only as the last token
    assert torch.equal(out.responses, rollout.generate(ids, mask, sp).responses)  # same seed, same samples
    assert out.response_mask.sum(-1).float().mean() > 1  # it sampled, not just stopped


def test_temperature_log_probs_are_of_the_processed_distribution(engine_and_model):
    rollout, model = engine_and_model
    ids = torch.randint(6, 40, (4, 5))
    mask = torch.ones_like(ids)
    out = rollout.generate(ids, mask, SamplingParams(max_tokens=3, temperature=0.7, stop_token_ids=[1], seed=1))
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    expected = gather_log_probs(response_logits(logits, 3, temperature=0.7), out.responses) * out.response_mask
    torch.testing.assert_close(expected, out.response_log_probs, atol=1e-5, rtol=1e-5)


def test_update_weights_rejects_unknown_names(engine_and_model):
    with pytest.raises(KeyError, match="architectures differ"):
        engine_and_model[0].update_weights([("not.a.weight", torch.zeros(1))])


def test_groups_share_their_prefill_and_finished_rows_leave_the_batch(engine_and_model):
    """n samples per prompt (interleaved) prefill each prompt once; rows that stop early drop out of the decode
    batch. Sampled tokens' log-probs still equal the training forward's, and greedy rows equal decoding alone."""
    from rlcore.rollout.native import group_size

    rollout, model = engine_and_model
    prompts = torch.tensor([[0, 7, 8, 9], [10, 11, 12, 13], [0, 0, 14, 15]])
    ids, mask = prompts.repeat_interleave(4, 0), (prompts != 0).long().repeat_interleave(4, 0)
    assert group_size(ids, mask) == 4 and group_size(prompts, (prompts != 0).long()) == 1
    assert group_size(torch.cat([ids[:4], ids[5:9]]), torch.cat([mask[:4], mask[5:9]])) == 1  # runs of unequal prompts
    eos = 20
    sp = SamplingParams(max_tokens=10, temperature=1.0, stop_token_ids=[eos], seed=7)
    out = rollout.generate(ids, mask, sp)
    lengths = out.response_mask.sum(-1)
    assert lengths.min() < lengths.max()  # some rows left the batch early
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    train_lp = gather_log_probs(response_logits(logits, 10), out.responses) * out.response_mask
    torch.testing.assert_close(train_lp, out.response_log_probs, atol=1e-5, rtol=1e-5)
    greedy = SamplingParams(max_tokens=10, do_sample=False, stop_token_ids=[eos])
    together = rollout.generate(ids, mask, greedy)
    for row in (0, 5, 11):
        alone = rollout.generate(ids[row : row + 1], mask[row : row + 1], greedy)
        assert torch.equal(together.responses[row], alone.responses[0])


@pytest.mark.parametrize("check_every", [3, 7])
def test_checking_for_finished_rows_every_few_steps_changes_nothing_but_the_work(tiny_model_dir, check_every):
    """CUDA checks for finished rows every few steps (each check is a host sync): rows that finished in between
    decode on into the spare column, which is dropped, and write KV only into their own slots, up to its end."""
    model = load_causal_lm(tiny_model_dir).eval()
    engines = []
    for every in (1, check_every):
        rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu"), max_num_seqs=6)
        rollout.update_weights(model.named_parameters())
        rollout.finish_check_every = every
        engines.append(rollout)
    prompts = torch.randint(6, 40, (5, 5), generator=torch.Generator().manual_seed(2))
    prompts[2, :3] = 0
    ids, mask = prompts.repeat_interleave(2, 0), (prompts != 0).long().repeat_interleave(2, 0)  # 10 rows, 6 slots: waves
    greedy = SamplingParams(max_tokens=9, do_sample=False, stop_token_ids=[20, 21, 22, 23, 24, 25])
    every_step, lagged = (rollout.generate(ids, mask, greedy) for rollout in engines)
    assert every_step.response_mask.sum(-1).min() < 9  # rows did stop early
    assert torch.equal(every_step.responses, lagged.responses) and torch.equal(every_step.response_mask, lagged.response_mask)
    torch.testing.assert_close(every_step.response_log_probs, lagged.response_log_probs, atol=1e-5, rtol=1e-5)
    # Sampling: finished rows draw noise too, so the samples differ, but they are still the model's.
    sampled = engines[1].generate(ids, mask, SamplingParams(max_tokens=9, stop_token_ids=list(range(6, 20)), seed=3))
    seq = assemble_sequences(ids, mask, sampled)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    expected = gather_log_probs(response_logits(logits, 9), sampled.responses) * sampled.response_mask
    torch.testing.assert_close(expected, sampled.response_log_probs, atol=1e-5, rtol=1e-5)
    for row, row_mask in zip(sampled.responses, sampled.response_mask):
        assert (row[int(row_mask.sum()):] == 0).all()


def test_sleep_level_2_frees_the_weights_and_only_a_full_sync_brings_them_back(tiny_model_dir):
    """The hybrid engine's sleep between steps: level 1 keeps the engine's own weight copy (LoRA syncs send only the
    adapted weights), level 2 frees it in place, views into the fused GEMMs included, and a sync refills it."""
    model = load_causal_lm(tiny_model_dir).eval()
    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu"), seed=0)
    weights = list(model.state_dict().items())
    rollout.update_weights(weights)
    ids, mask = torch.randint(6, 40, (4, 5), generator=torch.Generator().manual_seed(0)), torch.ones(4, 5, dtype=torch.long)
    greedy = SamplingParams(max_tokens=6, do_sample=False)
    before = rollout.generate(ids, mask, greedy)
    held = rollout.memory_bytes()["rollout_weights"]
    assert rollout.decoder is not None and held == sum(p.numel() * 4 for p in model.parameters())  # fp32, a tied head once
    rollout.sleep(level=1)
    assert rollout.memory_bytes() == {"rollout_weights": held, "kv_cache": 0}
    torch.testing.assert_close(rollout.generate(ids, mask, greedy).response_log_probs, before.response_log_probs, atol=0, rtol=0)

    rollout.sleep(level=2)
    assert rollout.memory_bytes() == {"rollout_weights": 0, "kv_cache": 0}
    with pytest.raises(RuntimeError, match=r"wake_up\(\['weights'\]\)"):
        rollout.generate(ids, mask, greedy)
    with pytest.raises(RuntimeError, match=r"call wake_up\(\['weights'\]\) first"):
        rollout.update_weights(weights)
    rollout.wake_up(["weights"])
    assert rollout.memory_bytes()["rollout_weights"] == held
    rollout.update_weights(w for w in weights if w[0] != "model.layers.0.self_attn.k_proj.weight")
    with pytest.raises(RuntimeError, match=r"all but 1 of them \(model.layers.0.self_attn.k_proj.weight\)"):
        rollout.generate(ids, mask, greedy)
    rollout.update_weights(weights)
    after = rollout.generate(ids, mask, greedy)
    assert torch.equal(after.responses, before.responses)
    torch.testing.assert_close(after.response_log_probs, before.response_log_probs, atol=0, rtol=0)
