"""The native rollout's per-call bookkeeping (rlcore.rollout.native_batch), without a model: which groups join,
where each sampled token goes, and how finished slots leave. The engine's tokens and log-probs through it are
tests/rollout/test_native.py's."""

import torch

from rlcore.rollout.native_batch import Requests, RunningBatch, Scheduler


def test_a_group_joins_only_with_a_slot_for_each_sample_and_within_the_prefill_budget():
    scheduler = Scheduler(batch=8, n=2, prompt_len=10, max_batched_tokens=25)
    assert scheduler.admit(running=0, num_slots=6) == [0, 2]  # a third group would prefill 30 tokens
    assert scheduler.admit(running=4, num_slots=6) == [4]     # 2 free slots: one group of 2
    assert scheduler.admit(running=6, num_slots=6) == []
    assert scheduler.admit(running=0, num_slots=6) == [6] and not scheduler
    alone = Scheduler(batch=2, n=1, prompt_len=50, max_batched_tokens=10)
    assert alone.admit(running=0, num_slots=4) == [0]  # over any budget, still taken when nothing runs


def test_sampled_tokens_go_to_their_columns_and_finished_slots_to_the_spare():
    requests = Requests.of(torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long), 1, 3, -1, None, None)
    running = RunningBatch.empty(vocab=5, device=torch.device("cpu"))
    running.add(torch.tensor([0, 1, 2]), torch.full((3,), 2), torch.zeros(3, 5), prompt_len=2)
    stop = torch.tensor([9])
    for token in ([9, 4, 4], [1, 5, 5], [2, 6, 9]):  # row 0 stops at once, row 2 at its third token
        token = torch.tensor(token)
        requests.record(running.req, running.sampled(token, stop, max_tokens=3), token, torch.zeros(3))
    assert requests.responses[:, :3].tolist() == [[9, -1, -1], [4, 5, 6], [4, 5, 9]]
    assert requests.alive[:, :3].sum(1).tolist() == [1, 3, 3]  # row 0's later tokens went to the spare column 3
    assert running.done.tolist() == [True, True, True] and running.steps.tolist() == [1, 3, 3]
    running.select(torch.tensor([2]))
    assert running.req.tolist() == [2] and running.token.tolist() == [9] and len(running) == 1
    out = requests.output(None)
    assert out.responses.shape == (3, 3) and out.response_mask.tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 1]]
