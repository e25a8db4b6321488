"""verl 0.9's colocate_async without Ray: the trainer's side (rlcore.trainer.colocate_async) over two fake ranks,
each a real native engine behind rlcore.rollout.partial, as the hybrid workers hold them."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlcore.models.hf import load_causal_lm
from rlcore.protocol import DataProto
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.native import NativeRollout
from rlcore.rollout.partial import PartialRollouts, groups_to_drop
from rlcore.trainer.colocate_async import ColocatedAsync

N, GROUPS, RANKS = 2, 4, 2  # samples per prompt, prompts a step trains, ranks
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, stop_token_ids=[20, 21, 22, 23, 24, 25], seed=3)


class FakeRanks:
    """A hybrid worker group's generate_sequences, dealt out in contiguous chunks over RANKS in-process ranks."""

    world_size = RANKS

    def __init__(self, model_dir: str, strategy: str, max_span: int) -> None:
        model = load_causal_lm(model_dir).eval()
        self.ranks = [(NativeRollout(None, 0, torch.device("cpu"), model=model), PartialRollouts(N, max_span, strategy, 0)) for _ in range(RANKS)]
        self.sent = 0

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.sent += len(prompts)
        outs = [partial.step(engine, part, SAMPLING, **prompts.meta_info["colocate_async"])[0]
                for (engine, partial), part in zip(self.ranks, prompts.chunk(RANKS))]
        out = DataProto.concat(outs)
        out.meta_info.update(timing={}, memory={})
        return out


def config(strategy: str, max_span: int, warmup: int = 1):
    return OmegaConf.create({"trainer": {"v1": {"colocate_async": {"num_warmup_batches": warmup},
                                                "sampler": {"max_off_policy_threshold": max_span, "max_off_policy_strategy": strategy}}},
                             "data": {"train_batch_size": GROUPS}, "actor_rollout_ref": {"rollout": {"n": N}}})


def prompt_batch(step: int, count: int) -> DataProto:
    """`count` prompts of 4 tokens, rollout.n rows each, with the columns the trainer keeps (uid, the prompt as text)."""
    ids = torch.randint(6, 40, (count, 4), generator=torch.Generator().manual_seed(step))
    ids[0, :2] = 0
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": (ids != 0).long(), "position_ids": torch.zeros_like(ids)},
                                {"uid": np.array([f"{step}-{i}" for i in range(count)], dtype=object),
                                 "text": np.array([" ".join(map(str, row.tolist())) for row in ids], dtype=object)})
    return batch.repeat(N, interleave=True)


@pytest.mark.parametrize("strategy,max_span,warmup", [("drop", 2, 2), ("wait", 2, 1), ("drop", 8, 1)])
def test_each_step_trains_whole_groups_joined_to_their_own_columns_within_the_bound(tiny_model_dir, strategy, max_span, warmup):
    """Each step gets data.train_batch_size whole groups; every sample's kept columns are its own prompt's (joined by
    row id across the ranks); no sample spans more versions than the bound (two warm-up batches keep three steps'
    prompts in flight, past a bound of 2: with `drop` the oldest go; with `wait` and one, the groups at the bound
    are trained first); what the ranks hold is what the trainer waits for; and every row sent is trained once,
    dropped, or still in flight."""
    ranks = FakeRanks(tiny_model_dir, strategy, max_span)
    trainer = ColocatedAsync(config(strategy, max_span, warmup), ranks)
    trained, dropped = 0, 0
    for step in range(1, 7):
        metrics = {}
        new = [prompt_batch(100 * step + i, GROUPS) for i in range(trainer.batches_due())]
        batch = trainer.take(new, metrics, step)
        assert len(batch) == GROUPS * N
        uids = batch.non_tensor_batch["uid"]
        assert all(len(set(uids[g * N:(g + 1) * N])) == 1 for g in range(GROUPS)) and len(set(uids)) == GROUPS
        for row in range(len(batch)):  # the prompt the sequence was generated from is the one its columns describe
            prompt = batch.batch["prompts"][row]
            assert " ".join(map(str, prompt[-4:].tolist())) == batch.non_tensor_batch["text"][row]
        assert batch.batch["response_mask"].sum(-1).min() >= 1 and "row_id" not in batch.batch.keys()
        assert metrics["async/staleness_max"] <= max_span - 1
        assert len(trainer.waiting) == sum(len(p.rows) for _, p in ranks.ranks) == metrics["async/carried_rows"]
        trained, dropped = trained + len(batch), dropped + metrics["async/dropped_samples"]
        assert ranks.sent == (warmup + step) * GROUPS * N  # the warm-up's batches, then one a step
    assert trained + dropped + len(trainer.waiting) == ranks.sent
    assert (dropped > 0) == (strategy == "drop" and max_span == 2), dropped


def test_the_drop_rule_takes_whole_groups_past_the_bound():
    started = torch.tensor([0, 0, 1, 1, 2, 2])
    assert groups_to_drop(started, 3, 2, 2).tolist() == [True, True, False, False, False, False]  # spans 3, 2, 1
    assert groups_to_drop(torch.tensor([0, 1]), 3, 2, 2).tolist() == [True, True]  # a group goes as a whole
