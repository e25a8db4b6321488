"""SFT worker: the logged loss is the response tokens' NLL by hand, the same however the batch is micro-batched
or packed, and training lowers it."""

import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo, token_outputs
from omegaconf import OmegaConf

from rlcore.data.sft_rows import read_sft
from rlcore.data.synthetic import make_addition_rows, write_parquet
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.hf import load_causal_lm
from rlcore.train_sft import compose_sft
from rlcore.workers.sft_trainer import SFTTrainerWorker

pytestmark = pytest.mark.numerics


def worker_for(model_dir, *overrides):
    cfg = compose_sft([f"model.partial_pretrain={model_dir}", "optim.lr=1e-3", "optim.weight_decay=0", "trainer.device=cpu",
                       "trainer.n_gpus_per_node=1", "model.fsdp_config.dtype=float32", *overrides])
    worker = SFTTrainerWorker(OmegaConf.to_container(cfg, resolve=True))
    worker.init_model(10)
    return worker


def test_sft_loss_is_response_nll_by_hand_for_any_micro_batching(tiny_model_dir, tmp_path):
    rows = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in make_addition_rows(6, 1, 2, seed=4)]
    tok = build_char_tokenizer()
    data = read_sft([write_parquet(rows, str(tmp_path / "s.parquet"))], tok, "prompt", "response", 32, "error")
    batch = data.batch(list(range(6)), tok.pad_token_id)
    model = load_causal_lm(tiny_model_dir).eval()
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    r = b["responses"].shape[-1]
    lp = token_outputs(logits[:, -r - 1 : -1], b["responses"])["log_probs"]
    expected = -(lp * b["response_mask"]).sum() / b["response_mask"].sum()
    init_gloo(0, 1, free_port())
    try:
        losses = []
        for overrides in (["data.micro_batch_size_per_gpu=6", "model.use_remove_padding=False"],
                          ["data.micro_batch_size_per_gpu=4", "model.use_remove_padding=True"],
                          ["data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=40"]):
            worker = worker_for(tiny_model_dir, *overrides)
            assert worker.evaluate(batch)["val/loss"] == pytest.approx(expected.item(), abs=1e-5)
            losses.append([worker.train_batch(batch)["train/loss"] for _ in range(15)])
    finally:
        close_gloo()
    for run in losses:
        assert run[0] == pytest.approx(expected.item(), abs=1e-5) and run[-1] < 0.7 * run[0]  # measured 4.75 -> 2.82
    # the same updates whatever the micro-batching and packing (float noise only)
    assert losses[1][-1] == pytest.approx(losses[0][-1], rel=1e-3) and losses[2][-1] == pytest.approx(losses[0][-1], rel=1e-3)


def greedy_tokens(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_token_accuracy_and_exact_match_are_greedy_decoding_by_hand(tiny_model_dir, tmp_path):
    # Half the rows' responses are what greedy decoding generates (exact match 1 by construction), half the task's
    # answers; the worker's metrics must equal argmax of the full logits, over 2 micro-batches of 3 rows.
    from rlcore.data.sft_rows import SFTData

    tok = build_char_tokenizer()
    rows = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in make_addition_rows(6, 1, 2, seed=4)]
    task = read_sft([write_parquet(rows, str(tmp_path / "s.parquet"))], tok, "prompt", "response", 32, "error")
    model = load_causal_lm(tiny_model_dir).eval()
    responses = [greedy_tokens(model, p, 2 + i) if i < 3 else r for i, (p, r) in enumerate(zip(task.prompts, task.responses))]
    batch = SFTData(task.prompts, responses).batch(list(range(6)), tok.pad_token_id)
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    r = b["responses"].shape[-1]
    hits = (logits[:, -r - 1 : -1].argmax(-1) == b["responses"]) & b["response_mask"].bool()
    exact = (hits.sum(-1) == b["response_mask"].sum(-1)).float()
    assert exact[:3].tolist() == [1.0, 1.0, 1.0]
    init_gloo(0, 1, free_port())
    try:
        for packed in (False, True):
            metrics = worker_for(tiny_model_dir, "data.micro_batch_size_per_gpu=3", f"model.use_remove_padding={packed}").evaluate(batch)
            assert metrics["val/token_accuracy"] == pytest.approx((hits.sum() / b["response_mask"].sum()).item(), abs=1e-6)
            assert metrics["val/exact_match"] == pytest.approx(exact.mean().item(), abs=1e-6)
    finally:
        close_gloo()


def _sp2_rank(rank, world, port, model_dir, batch_path, out_dir):
    """verl's SFT Ulysses: 2 ranks share each sample's tokens (one data-parallel replica) and see the whole batch."""
    import os

    init_gloo(rank, world, port)
    try:
        batch = torch.load(batch_path, weights_only=False)
        cfg = compose_sft([f"model.partial_pretrain={model_dir}", "optim.lr=1e-3", "optim.weight_decay=0", "trainer.device=cpu",
                           "trainer.n_gpus_per_node=2", "model.fsdp_config.dtype=float32", "data.micro_batch_size_per_gpu=6",
                           "ulysses_sequence_parallel_size=2"])
        worker = SFTTrainerWorker(OmegaConf.to_container(cfg, resolve=True), rank=rank, world_size=world)
        worker.init_model(10)
        assert (worker.engine.dp_size, worker.engine.spec.ulysses_sp) == (1, 2)
        result = {"val": worker.evaluate(batch).get("val/loss"), "train": [worker.train_batch(batch)["train/loss"] for _ in range(3)]}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        close_gloo()


def test_top_level_ulysses_size_splits_each_sample_over_two_ranks_with_the_same_losses(tiny_model_dir, tmp_path):
    from dist_utils import spawn_ranks

    rows = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in make_addition_rows(6, 1, 2, seed=4)]
    tok = build_char_tokenizer()
    data = read_sft([write_parquet(rows, str(tmp_path / "s.parquet"))], tok, "prompt", "response", 32, "error")
    batch = data.batch(list(range(6)), tok.pad_token_id)
    torch.save(batch, tmp_path / "batch.pt")
    init_gloo(0, 1, free_port())
    try:
        single = worker_for(tiny_model_dir, "data.micro_batch_size_per_gpu=6")
        expected = {"val": single.evaluate(batch)["val/loss"], "train": [single.train_batch(batch)["train/loss"] for _ in range(3)]}
    finally:
        close_gloo()
    spawn_ranks(_sp2_rank, 2, lambda port: (2, port, tiny_model_dir, str(tmp_path / "batch.pt"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["val"] == pytest.approx(expected["val"], abs=1e-5)  # the output rank reports the replica's loss
    for r in ranks:
        assert r["train"] == pytest.approx(expected["train"], abs=1e-5)  # both ranks, every step: the same updates


def test_checkpoint_contents_decide_what_a_save_holds_and_a_resume_restores(tiny_model_dir, tmp_path):
    """verl's SFT checkpoint.save_contents / load_contents: a save without "optimizer" holds none (contents.json says
    what it holds), a resume that asks for it is refused with the fix, and one that asks for the model alone loads
    the trained weights into a fresh worker (whose optimizer starts afresh). engine.seed seeds the workers (LoRA's
    init) and engine.full_determinism switches torch to deterministic kernels."""
    import json

    from rlcore.data.synthetic import make_addition_rows

    tok = build_char_tokenizer()
    rows = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in make_addition_rows(4, 1, 2, seed=4)]
    batch = read_sft([write_parquet(rows, str(tmp_path / "s.parquet"))], tok, "prompt", "response", 32, "error").batch(list(range(4)), tok.pad_token_id)
    init_gloo(0, 1, free_port())
    try:
        saving = worker_for(tiny_model_dir, "checkpoint.save_contents=[model,extra]", "engine.seed=3", "engine.full_determinism=True")
        assert torch.are_deterministic_algorithms_enabled()
        saving.train_batch(batch)
        saving.save_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
        assert json.load(open(tmp_path / "ckpt" / "contents.json")) == ["extra", "model"]
        trained = {n: p.full_tensor().clone() for n, p in saving.engine.model.named_parameters()}
        with pytest.raises(ValueError, match=r"checkpoint.load_contents=\['extra', 'model', 'optimizer'\] asks for \['optimizer'\], but "
                                             r".* holds only \['extra', 'model'\] .*: drop \['optimizer'\] from checkpoint.load_contents"):
            worker_for(tiny_model_dir).load_checkpoint(str(tmp_path / "ckpt"))
        fresh = worker_for(tiny_model_dir, "checkpoint.load_contents=[model]")
        fresh.load_checkpoint(str(tmp_path / "ckpt"))
        assert all(torch.equal(p.full_tensor(), trained[n]) for n, p in fresh.engine.model.named_parameters())
        lora = [worker_for(tiny_model_dir, "model.lora_rank=4", f"engine.seed={seed}") for seed in (3, 3, 4)]
        a_init = [{n: p.full_tensor() for n, p in w.engine.model.named_parameters() if "lora_A" in n} for w in lora]
        assert all(torch.equal(a_init[0][n], a_init[1][n]) for n in a_init[0]) and not torch.equal(*[next(iter(a.values())) for a in (a_init[0], a_init[2])])
    finally:
        torch.use_deterministic_algorithms(False)
        close_gloo()
