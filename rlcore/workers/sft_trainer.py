"""Supervised fine-tuning over a TrainEngine: the token-mean NLL of the response tokens (the prompt is context,
never a target), micro-batched by samples or token budgets, exact over ranks and micro-batches."""

from __future__ import annotations

import time

import torch

from rlcore.config.sft_schema import SFTTrainerConfig
from rlcore.controller.decorator import Dispatch, register
from rlcore.data.micro_batches import MicroBatchSpec, make_micro_batches
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.protocol import DataProto
from rlcore.utils.determinism import deterministic_kernels  # verl's engine.full_determinism
from rlcore.workers.common import SupervisedWorker, layout_of, mini_batch_counts


class SFTTrainerWorker(SupervisedWorker):
    """One process per device: a shard of the model being fine-tuned, and its optimizer."""

    schema = SFTTrainerConfig

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg = self.config
        torch.manual_seed(cfg.engine.seed)  # follows trainer.seed unless set (verl's engine.seed)
        if cfg.model.fsdp_config.full_determinism:  # follows engine.full_determinism (verl's newer SFT key)
            deterministic_kernels()
        spec = engine_spec(cfg.model.strategy, cfg.model, cfg.model, cfg.optim, cfg.optim.clip_grad, total_steps)
        self.engine = build_engine(cfg.model.strategy, spec, self.device, key="model.strategy")
        self.layouts["sft"] = layout_of(self.engine)

    def _micro(self) -> MicroBatchSpec:
        d, packed = self.config.data, self.engine.spec.use_remove_padding
        return (MicroBatchSpec(max_tokens=d.max_token_len_per_gpu, packed=packed) if d.use_dynamic_bsz
                else MicroBatchSpec(rows=d.micro_batch_size_per_gpu, packed=packed))

    def _nll(self, data: DataProto):
        """Per micro-batch: its share of the batch's token-mean NLL over every rank's response tokens (x dp_size:
        gradients are averaged over ranks), so shares sum, and average over ranks, to the exact batch loss."""
        tokens, dp = mini_batch_counts(data.batch["response_mask"], self.engine)[0], self.engine.dp_size

        def share(outputs, mb):
            mask = mb.batch["response_mask"].to(outputs["log_probs"].device)
            return -(outputs["log_probs"] * mask).sum() / tokens * dp

        return share

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="sft")
    def train_batch(self, data: DataProto) -> dict[str, float]:
        start, share = time.perf_counter(), self._nll(data)

        def loss_fn(outputs, mb):
            loss = share(outputs, mb)
            return loss, {"train/loss": loss.detach()}  # read with the other micro-batches' in one host sync

        per_micro = self.engine.forward_backward(make_micro_batches(data, self._micro())[0], loss_fn)
        step = self.engine.optimizer_step()
        return {"train/loss": sum(m["train/loss"] for m in per_micro), "train/grad_norm": step["grad_norm"], "train/lr": step["lr"],
                "timing_s/update_on_rank": time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="sft")
    def evaluate(self, data: DataProto) -> dict[str, float]:
        """val/loss (token-mean NLL), val/token_accuracy (response tokens that are the model's most likely next
        token, TRL's mean_token_accuracy) and val/exact_match (responses all of whose tokens are: exactly the rows
        greedy decoding reproduces), each exact over ranks and micro-batches."""
        share = self._nll(data)
        tokens, rows = mini_batch_counts(data.batch["response_mask"], self.engine)
        dp = self.engine.dp_size

        def fn(out, mb):
            mask = mb.batch["response_mask"].to(out["log_probs"].device)
            hits = (out["log_probs"] >= out["top_log_probs"]).float() * mask
            rows_with_tokens = mask.sum(-1) > 0  # the rows mini_batch_counts counts
            exact = ((hits.sum(-1) == mask.sum(-1)) & rows_with_tokens).float()
            return {"nll": share(out, mb)[None], "hits": (hits.sum() / tokens * dp)[None], "exact": (exact.sum() / rows * dp)[None]}

        outputs = self.engine.forward(make_micro_batches(data, self._micro())[0], fn)
        total = lambda key: float(sum(o[key].sum() for o in outputs))  # noqa: E731
        return {"val/loss": total("nll"), "val/token_accuracy": total("hits"), "val/exact_match": total("exact")} if outputs else {}
