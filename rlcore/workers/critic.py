"""The critic role: a value model over a TrainEngine, written once for every backend (verl's dp_critic)."""

from __future__ import annotations

import time

import torch

from rlcore.algos import agg_loss
from rlcore.algos.agg import statistic_mode
from rlcore.algos.value import clipped_value_loss
from rlcore.controller.decorator import Dispatch, register
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import CHECKPOINT_STATE, LossFn, TrainEngine
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.models.hf import import_external_lib, named_load
from rlcore.plan.micro_plan import CRITIC_UPDATE, CRITIC_VALUES
from rlcore.protocol import DataProto
from rlcore.utils import checkpoint
from rlcore.utils.determinism import deterministic_kernels
from rlcore.workers import phases
from rlcore.workers.common import RoleWorker, layout_of, load_rng_state, run_forward, run_ppo_updates, save_rng_state


def compute_values(engine: TrainEngine, data: DataProto, micro: MicroBatchSpec) -> DataProto:
    """`values` `[batch, response_len]`, zero outside the response mask."""

    # outputs["values"] is V(s_t) for each response token t: the head's output at the state BEFORE the token (the
    # state in which it was chosen; the engine hands over exactly those).
    def fn(outputs: dict[str, torch.Tensor], mb: DataProto) -> dict[str, torch.Tensor]:
        values = outputs["values"]
        return {"values": values * mb.batch["response_mask"].to(values.device)}

    return run_forward(engine, data, micro, fn)


def make_value_loss_fn(critic_cfg, counts: tuple[float, float], dp_size: int) -> LossFn:
    """Per-micro-batch clipped value loss, aggregated with critic.loss_agg_mode over the whole mini-batch."""

    def loss_fn(outputs: dict[str, torch.Tensor], mb: DataProto) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        vpreds = outputs["values"]
        b = {k: v.to(vpreds.device) for k, v in mb.batch.items()}
        mask = b["response_mask"]
        agg = lambda mat: agg_loss(mat, mask, critic_cfg.loss_agg_mode, counts[0], counts[1], dp_size,  # noqa: E731
                                   critic_cfg.loss_scale_factor)
        loss_mat, stats = clipped_value_loss(vpreds, b["values"], b["returns"], critic_cfg.cliprange_value)
        loss = agg(loss_mat)
        stat = lambda mat: agg_loss(mat, mask, statistic_mode(critic_cfg.loss_agg_mode), counts[0], counts[1], dp_size)  # noqa: E731
        metrics = {"critic/vf_loss": loss.detach(), "critic/vpred_mean": stat(vpreds.detach())}  # on the device until run_ppo_updates reads them
        metrics.update({k: stat(v).detach() for k, v in stats.items()})
        return loss, metrics

    return loss_fn


def update_value(engine: TrainEngine, data: DataProto, critic_cfg, micro: MicroBatchSpec, rollout_n: int) -> dict[str, float]:
    """critic.ppo_epochs x mini-batches (critic.ppo_mini_batch_size prompts x rollout.n) x micro-batches."""
    return run_ppo_updates(
        engine, data, critic_cfg.ppo_epochs, critic_cfg.ppo_mini_batch_size * rollout_n // engine.dp_size, micro,
        lambda counts: make_value_loss_fn(critic_cfg, counts, engine.dp_size), "critic",
        shuffle_seed=critic_cfg.data_loader_seed if critic_cfg.shuffle else None,
    )


class CriticWorker(RoleWorker):
    """One process per device holding a shard of the value model and its optimizer."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg = self.config.critic
        if cfg.fsdp.full_determinism:  # process-wide, before any kernel runs (verl 0.9's critic.fsdp.full_determinism)
            deterministic_kernels()
        torch.manual_seed(self.config.trainer.seed)  # identical value-head init on every rank before sharding
        import_external_lib(cfg.model.external_lib, "critic.model.external_lib")  # registers a custom architecture
        spec = engine_spec(cfg.strategy, cfg.model, cfg, cfg.optim, cfg.grad_clip, total_steps, kind="value")
        with named_load("critic.model.path", cfg.model.path):
            self.engine = build_engine(cfg.strategy, spec, self.device, key="critic.strategy")
        self.layouts["critic"] = layout_of(self.engine)
        phases.leave(self.engine)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, mesh="critic")
    def compute_values(self, data: DataProto) -> DataProto:
        micro = self.micro_batches(CRITIC_VALUES, self.engine)
        with phases.running(self.engine, "values"):
            return compute_values(self.engine, data, micro)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="critic")
    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config.critic
        start = time.perf_counter()
        phases.reset_peak(self.device)
        micro = self.micro_batches(CRITIC_UPDATE, self.engine)
        with phases.running(self.engine, "update_critic"):
            metrics = update_value(self.engine, data, cfg, micro, self.config.actor_rollout_ref.rollout.n)
            metrics.update(phases.ledger("update_critic", {"critic": self.engine}, device=self.device))
        metrics["timing_s/update_critic_on_rank"] = time.perf_counter() - start
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, hf_dir: str) -> None:
        """What critic.checkpoint.save_contents names (verl 0.9's key; the actor's own rule: model, optimizer,
        extra into `path`, HF safetensors of the value model into `hf_dir` with "hf_model")."""
        contents = checkpoint.checked_contents(self.config.critic.checkpoint.save_contents, "critic.checkpoint.save_contents")
        with phases.running(self.engine, "checkpoint"):
            self.engine.save(path, hf_dir=hf_dir if "hf_model" in contents else None, contents=contents & CHECKPOINT_STATE)
        if self.rank == 0:
            checkpoint.write_contents(path, contents)
        if "extra" in contents:
            save_rng_state(path, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """What critic.checkpoint.load_contents names, refused if `path` does not hold it."""
        key = "critic.checkpoint.load_contents"
        contents, notes = checkpoint.restore_plan(path, checkpoint.checked_contents(self.config.critic.checkpoint.load_contents, key),
                                                  key, role="critic")
        if self.rank == 0:
            for note in notes:
                print(f"WARNING: {note} ({path})", flush=True)
        with phases.running(self.engine, "checkpoint"):
            self.engine.load(path, contents=contents)
        if "extra" in contents:
            load_rng_state(path, self.rank)
