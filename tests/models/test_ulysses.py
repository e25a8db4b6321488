"""Ulysses' bookkeeping without a process group: how a packed row is padded and sliced, which outputs each rank's
states give, and which models it can split (the collectives themselves: tests/engine/test_fsdp2_ulysses.py)."""

import pytest
import torch

from rlcore.models.ulysses import Ulysses, attach_ulysses, check_heads
from rlcore.models.varlen import pack_sequences


def _rank(rank: int, size: int = 2) -> Ulysses:
    view = Ulysses.__new__(Ulysses)  # the group's size and this rank are all shard() reads
    view.group, view.size, view.rank = None, size, rank
    return view


def _packed():
    # two rows: 3 + 4 prompt tokens (left-padded to 4) and responses of 2 and 3 tokens (right-padded to 3): 12 tokens
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    ids = torch.arange(1, 15).view(2, 7) * mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return pack_sequences(ids, mask, positions, response_len=3)


def test_an_odd_row_is_padded_with_a_sequence_of_its_own():
    packed = _packed()
    total = packed.input_ids.shape[-1]
    assert total == 12 and packed.response_index.tolist() == [2, 3, 8, 9, 10]
    odd = pack_sequences(torch.tensor([[5, 6, 7, 8, 9]]), torch.ones(1, 5, dtype=torch.long), torch.arange(5)[None], 2)
    local, shard = _rank(1).shard(odd, odd.response_index)
    assert (shard.start, shard.length) == (3, 3)  # 5 tokens -> 6, three per rank
    assert local.input_ids.tolist() == [[8, 9, 0]] and local.position_ids.tolist() == [[3, 4, 0]]
    assert local.attention_kwargs["cu_seq_lens_q"].tolist() == [0, 5, 6]  # the padding attends only to itself


def test_each_rank_computes_the_outputs_of_the_states_it_holds():
    packed = _packed()
    for rank, expected_local in ((0, [2, 3]), (1, [2, 3, 4])):
        local, shard = _rank(rank).shard(packed, packed.response_index)
        assert shard.response_counts == [2, 3] and shard.local_index.tolist() == expected_local
        assert local.input_ids.shape[-1] == 6 and local.attention_kwargs["cu_seq_lens_q"].tolist() == [0, 5, 12]
        tokens = torch.arange(5)[None]
        assert _rank(rank).mine(shard, tokens).tolist() == [[[0, 1]], [[2, 3, 4]]][rank]


def test_a_state_and_the_token_it_predicts_may_sit_on_two_ranks():
    odd = pack_sequences(torch.tensor([[5, 6, 7, 8, 9]]), torch.ones(1, 5, dtype=torch.long), torch.arange(5)[None], 2)
    assert odd.response_index.tolist() == [2, 3]  # the states before the response tokens at 3 and 4
    _, shard = _rank(0).shard(odd, odd.response_index)
    assert shard.response_counts == [1, 1] and shard.local_index.tolist() == [2]  # rank 0 holds 0-2: the state at 2
    # a reward model reads its score AT each token (positions 3 and 4): both on rank 1
    _, shard = _rank(1).shard(odd, odd.response_index + 1)
    assert shard.response_counts == [0, 2] and shard.local_index.tolist() == [0, 1]


@pytest.mark.parametrize("heads, sp, ok", [(28, 4, True), (28, 8, False), (40, 8, True), (4, 2, True), (4, 3, False)])
def test_heads_must_divide(heads, sp, ok):
    assert (check_heads(heads, sp) is None) == ok


def test_blocks_without_self_attention_are_refused():
    with pytest.raises(NotImplementedError, match="has no self_attn module"):
        attach_ulysses(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), _rank(0))
