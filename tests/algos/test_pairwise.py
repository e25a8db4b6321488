"""Bradley-Terry pairwise loss and its metrics, by hand."""

import math

import torch

from rlcore.algos.pairwise import bradley_terry_loss, pair_metrics


def test_bradley_terry_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 3.0])
    expected = [math.log(1 + math.exp(-1.0)), math.log(2.0), math.log(1 + math.exp(4.0))]
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected), torch.tensor(expected))
    # a margin asks for a wider gap: -log sigmoid(d - m)
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected, torch.tensor([1.0, 0.0, 0.0]))[0], torch.tensor(math.log(2.0)))
    # finite where log(sigmoid(x)) underflows to -inf
    assert bradley_terry_loss(torch.tensor([-200.0]), torch.tensor([0.0])).item() == 200.0
    m = pair_metrics(chosen, rejected)
    assert m["accuracy"].tolist() == [1.0, 0.0, 0.0] and m["margin"].tolist() == [1.0, 0.0, -4.0]
