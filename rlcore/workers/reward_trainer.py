"""Reward-model training over a TrainEngine: a scalar head on an LM trunk, Bradley-Terry on preference pairs.

Rows come in pairs (chosen at 2i, rejected at 2i + 1; rlcore.data.pairs), and every split keeps pairs whole:
data-parallel chunks hold an even number of rows and micro-batches are cut between pairs.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rlcore.algos.pairwise import bradley_terry_loss, pair_metrics
from rlcore.config.rm_schema import RMTrainerConfig
from rlcore.controller.decorator import Dispatch, register
from rlcore.data.micro_batches import MicroBatchSpec, token_budget_partitions, trim_padding
from rlcore.engine.base import TrainEngine
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.protocol import DataProto
from rlcore.utils.determinism import deterministic_kernels
from rlcore.utils.dist import all_reduce_values
from rlcore.workers.common import SupervisedWorker, layout_of


def pair_micro_batches(data: DataProto, spec: MicroBatchSpec) -> list[DataProto]:
    """Micro-batches of whole pairs: `spec.rows` pairs each, or token-budget parts over pairs (each pair costs
    both of its sequences; every rank runs the same number of parts)."""
    if not spec.dynamic:
        return data.split(2 * spec.rows)
    pair_tokens = data.batch["attention_mask"].sum(-1).view(-1, 2).sum(-1).tolist()
    parts = token_budget_partitions(pair_tokens, spec.max_tokens, spec.packed)
    return [trim_padding(data.index([row for pair in part for row in (2 * pair, 2 * pair + 1)])) for part in parts]


def global_pairs(data: DataProto, engine: TrainEngine) -> float:
    """Pairs in this batch over every data-parallel rank: the normaliser that makes summed shares exact."""
    pairs = len(data) / 2
    return all_reduce_values([pairs], group=engine.dp_group)[0] if dist.is_initialized() else pairs


def pair_scores(outputs: dict[str, torch.Tensor], mb: DataProto) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = outputs["scores"][:, 0]
    return scores[0::2], scores[1::2], mb.batch["pair_margin"][0::2].to(scores.device)


def share(per_pair: torch.Tensor, pairs: float, dp_size: int) -> torch.Tensor:
    """This micro-batch's share of the mean over all pairs of all ranks (x dp_size: gradients are averaged)."""
    return per_pair.sum() / pairs * dp_size


class RewardTrainerWorker(SupervisedWorker):
    """One process per device: a shard of the reward model being trained, and its optimizer."""

    schema = RMTrainerConfig

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg = self.config
        if cfg.model.fsdp_config.full_determinism:  # process-wide, before any kernel runs
            deterministic_kernels()
        torch.manual_seed(cfg.trainer.seed)  # the head (and LoRA A) drawn identically on every rank
        spec = engine_spec(cfg.model.strategy, cfg.model, cfg.model, cfg.optim, cfg.optim.clip_grad, total_steps, kind="reward")
        self.engine = build_engine(cfg.model.strategy, spec, self.device, key="model.strategy")
        self.layouts["rm"] = layout_of(self.engine)

    def _micro(self) -> MicroBatchSpec:
        d = self.config.data
        if d.use_dynamic_bsz:
            return MicroBatchSpec(max_tokens=d.max_token_len_per_gpu, packed=self.engine.spec.use_remove_padding)
        return MicroBatchSpec(rows=d.micro_batch_size_per_gpu, packed=self.engine.spec.use_remove_padding)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="rm")
    def train_batch(self, data: DataProto) -> dict[str, float]:
        """One optimizer step on this rank's pairs; loss, accuracy and margin are exact means over all ranks."""
        start = time.perf_counter()
        pairs, dp = global_pairs(data, self.engine), self.engine.dp_size

        def loss_fn(outputs, mb):
            chosen, rejected, margin = pair_scores(outputs, mb)
            loss = share(bradley_terry_loss(chosen, rejected, margin), pairs, dp)
            stats = pair_metrics(chosen.detach(), rejected.detach())
            # Each metric is this micro-batch's share (x dp): summed over micro-batches and averaged over ranks by
            # the worker group, it is the exact mean over every pair.
            # 0-dim tensors: the engine reads every micro-batch's metrics in one host sync (engine.base.read_metrics)
            return loss, {"train/loss": loss.detach(), **{f"train/{k}": share(v, pairs, dp) for k, v in stats.items()}}

        per_micro = self.engine.forward_backward(pair_micro_batches(data, self._micro()), loss_fn)
        metrics = {k: sum(m[k] for m in per_micro) for k in (per_micro[0] if per_micro else ())}
        step = self.engine.optimizer_step()
        metrics.update({"train/grad_norm": step["grad_norm"], "train/lr": step["lr"], "timing_s/update_on_rank": time.perf_counter() - start})
        return metrics

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="rm")
    def evaluate(self, data: DataProto) -> dict[str, float]:
        """Validation loss, pair accuracy and mean reward margin (exact means over all ranks' pairs)."""
        pairs, dp = global_pairs(data, self.engine), self.engine.dp_size

        def fn(outputs, mb):
            chosen, rejected, margin = pair_scores(outputs, mb)
            return {"loss": bradley_terry_loss(chosen, rejected, margin), **pair_metrics(chosen, rejected)}

        outputs = self.engine.forward(pair_micro_batches(data, self._micro()), fn)
        if not outputs:
            return {}
        return {f"val/{k}": float(sum(o[k].sum() for o in outputs)) / pairs * dp for k in outputs[0]}
