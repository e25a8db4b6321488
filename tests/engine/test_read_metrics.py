"""Loss functions leave their metrics on the device; the engine reads a mini-batch's in one transfer."""

import torch

from rlcore.engine.base import read_metrics


def test_every_micro_batch_metric_comes_back_as_a_float_in_one_transfer(monkeypatch):
    per_micro = [{"loss": torch.tensor(0.5), "kl": torch.tensor(0.25), "n": 3.0}, {"loss": torch.tensor(1.5), "kl": torch.tensor(-1.0), "n": 1}]
    reads = []
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (reads.append("tolist"), real_tolist(t))[1])
    monkeypatch.setattr(torch.Tensor, "item", lambda t: (reads.append("item"), real_item(t))[1])
    out = read_metrics(per_micro)
    assert out == [{"loss": 0.5, "kl": 0.25, "n": 3.0}, {"loss": 1.5, "kl": -1.0, "n": 1.0}]
    assert all(type(v) is float for m in out for v in m.values())
    assert reads == ["tolist"]  # one host read for the whole mini-batch, not one per metric per micro-batch


def test_no_metrics_is_no_read():
    assert read_metrics([{}, {}]) == [{}, {}]
    assert read_metrics([]) == []
