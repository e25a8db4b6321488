"""Reward-model training worker: the logged loss/accuracy/margin equal Bradley-Terry by hand on the HF model's
scores, micro-batches split between pairs, and the step trains the head and trunk."""

import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo
from omegaconf import OmegaConf
from transformers import AutoModelForSequenceClassification

from rlcore.algos.pairwise import bradley_terry_loss
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.data.pairs import read_pairs
from rlcore.data.synthetic import make_addition_rows, preference_pairs, write_parquet
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.workers.reward_trainer import RewardTrainerWorker, pair_micro_batches

pytestmark = pytest.mark.numerics


@pytest.fixture
def pairs(tmp_path):
    rows = preference_pairs(make_addition_rows(8, 1, 2, seed=3), seed=3)
    for i, row in enumerate(rows):
        row["margin"] = 0.25 * (i % 2)
    tok = build_char_tokenizer()
    return read_pairs([write_parquet(rows, str(tmp_path / "p.parquet"))], tok, "prompt", "chosen", "rejected", "margin", 16, "error"), tok


def test_pair_micro_batches_never_split_a_pair(pairs):
    data, tok = pairs
    batch = data.batch(list(range(8)), tok.pad_token_id, 16)
    assert [len(mb) for mb in pair_micro_batches(batch, MicroBatchSpec(rows=3))] == [6, 6, 4]
    budget = pair_micro_batches(batch, MicroBatchSpec(max_tokens=40))
    assert sum(len(mb) for mb in budget) == 16 and all(len(mb) % 2 == 0 for mb in budget)
    for mb in budget:  # each part holds whole pairs: row 2i chosen, 2i + 1 its rejected (same margin)
        assert torch.equal(mb.batch["pair_margin"][0::2], mb.batch["pair_margin"][1::2])


def test_train_batch_logs_bradley_terry_by_hand_and_learns(pairs, tiny_model_dir, tmp_path):
    from rlcore.train_rm import compose_rm

    data, tok = pairs
    cfg = compose_rm([f"model.path={tiny_model_dir}", "data.micro_batch_size_per_gpu=3", "optim.lr=1e-3", "optim.weight_decay=0",
                      "trainer.device=cpu", "trainer.n_gpus_per_node=1", "model.fsdp_config.dtype=float32"])
    batch = data.batch(list(range(8)), tok.pad_token_id, 16)
    init_gloo(0, 1, free_port())
    try:
        worker = RewardTrainerWorker(OmegaConf.to_container(cfg, resolve=True))
        worker.init_model(10)
        before = worker.evaluate(batch)
        worker.engine.save_hf(str(tmp_path / "hf0"))
        metrics = worker.train_batch(batch)
        for _ in range(20):
            worker.train_batch(batch)
        after = worker.evaluate(batch)
    finally:
        close_gloo()
    rm = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf0")).eval()  # the exported head
    with torch.no_grad():
        scores = torch.stack([rm(input_ids=torch.tensor([s])).logits[0, 0] for i in range(8) for s in (data.chosen[i], data.rejected[i])])
    chosen, rejected, margin = scores[0::2], scores[1::2], torch.tensor(data.margin)
    loss = bradley_terry_loss(chosen, rejected, margin).mean()
    assert metrics["train/loss"] == pytest.approx(loss.item(), abs=1e-5) and before["val/loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert metrics["train/accuracy"] == pytest.approx((chosen > rejected).float().mean().item())
    assert metrics["train/margin"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-5)
    assert after["val/loss"] < 0.5 * before["val/loss"] and after["val/accuracy"] == 1.0  # 8 pairs, memorised
