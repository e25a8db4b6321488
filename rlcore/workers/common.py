"""What every trainable role shares, whatever its math: engine specs from config, the PPO mini-batch loop, and RNG
state in checkpoints (what each phase keeps on the device: rlcore.workers.phases)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from rlcore.config.schema import PPOConfig
from rlcore.config.typed import typed
from rlcore.controller.decorator import DataLayout, Dispatch, metric_reduction, register
from rlcore.controller.worker import Worker
from rlcore.data.micro_batches import MicroBatchSpec, make_micro_batches, pad_responses, restore_order
from rlcore.engine.base import CHECKPOINT_STATE, ForwardFn, LossFn, TokenRequest, TrainEngine
from rlcore.models.hf import quiet_transformers
from rlcore.plan.micro_plan import MicroBatch
from rlcore.plan.run_plan import planned_micro_batches
from rlcore.protocol import DataProto
from rlcore.utils import checkpoint
from rlcore.utils.checkpoint import checkpoint_load
from rlcore.utils.checkpoint_contents import STATE
from rlcore.utils.dist import all_reduce_values
from rlcore.utils.rng import rng_state, set_rng_state


class RoleWorker(Worker):
    """A worker process of one role, holding the whole run's config as the schema's objects (the controller sends
    them so; a dict of the composed config, as tests build, is laid over the schema's defaults)."""

    schema: type = PPOConfig  # the trainer config this role runs under

    def __init__(self, config: object, rank: int = 0, world_size: int = 1, device: str = "cpu",
                 micro: dict[str, MicroBatch] | None = None) -> None:
        """`micro`: each pass's micro-batches from the run plan (rlcore.plan.micro_plan), as the controller sends
        them; None derives the same plan here on first use (a worker built by a test)."""
        super().__init__(rank=rank, world_size=world_size, device=device)
        self.config = typed(config, self.schema)
        self._planned_micro = micro
        quiet_transformers()

    def micro_batches(self, name: str, engine: TrainEngine) -> MicroBatchSpec:
        """Pass `name`'s micro-batches (rlcore.plan.micro_plan's names) laid over `engine`: its token budget times
        the engine's Ulysses size, packed iff the engine packs (use_remove_padding)."""
        if self._planned_micro is None:
            self._planned_micro = planned_micro_batches(self.config)
        planned, packed = self._planned_micro[name], engine.spec.use_remove_padding
        if planned.rows is not None:
            return MicroBatchSpec(rows=planned.rows, packed=packed)
        return MicroBatchSpec(max_tokens=planned.max_tokens * engine.spec.ulysses_sp, packed=packed)


class SupervisedWorker(RoleWorker):
    """A role that trains one engine (`self.engine`) with nothing to offload between phases: reward-model
    training and SFT. Checkpoints are the engine's state plus this rank's RNG, as far as the trainer's
    checkpoint.save_contents / load_contents say (the SFT trainer's, as verl's; a trainer without them keeps all)."""

    engine: TrainEngine

    def _contents(self, which: str) -> frozenset[str]:
        """checkpoint.<which> as a set ("hf_model" too: the supervised trainers export HF weights at every save
        anyway, their result)."""
        section = getattr(self.config, "checkpoint", None)  # the SFT trainer's schema has it, the reward trainer's not
        if section is None:
            return frozenset(STATE)
        return checkpoint.checked_contents(getattr(section, which), f"checkpoint.{which}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, hf_dir: str | None) -> None:
        contents = self._contents("save_contents")
        self.engine.save(path, hf_dir=hf_dir, contents=contents & CHECKPOINT_STATE)
        if self.rank == 0:
            checkpoint.write_contents(path, contents)
        if "extra" in contents:
            save_rng_state(path, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """What checkpoint.load_contents names, refused if `path` does not hold it (rank 0 says what is left as built)."""
        contents, notes = checkpoint.restore_plan(path, self._contents("load_contents"), "checkpoint.load_contents", role="model")
        if self.rank == 0:
            for note in notes:
                print(f"WARNING: {note} ({path})", flush=True)
        self.engine.load(path, contents=contents)
        if "extra" in contents:
            load_rng_state(path, self.rank)


def layout_of(engine: TrainEngine) -> DataLayout:
    """The data-parallel layout the worker group splits this engine's batches over."""
    return DataLayout(engine.dp_rank, engine.dp_size, engine.is_output_rank)


def run_forward(engine: TrainEngine, data: DataProto, spec: MicroBatchSpec, fn: ForwardFn, request: TokenRequest = TokenRequest()) -> DataProto:
    """No-grad `fn` over this rank's micro-batches; per-token outputs `[batch, response_len]` in data's row order.
    Empty on a rank that is not its replica's output rank (the worker group collects from output ranks only)."""
    micro_batches, order = make_micro_batches(data, spec)
    outputs = engine.forward(micro_batches, fn, request)
    if not outputs:
        return DataProto.from_dict({})
    width, response_len = data.batch["input_ids"].shape[-1], data.batch["responses"].shape[-1]
    joined = {k: torch.cat([_full_width(o[k], mb, width, response_len) for o, mb in zip(outputs, micro_batches)]) for k in outputs[0]}
    return DataProto.from_dict(restore_order(joined, order))


def _full_width(t: torch.Tensor, mb: DataProto, width: int, response_len: int) -> torch.Tensor:
    """A trimmed micro-batch's output at the batch's width: `[rows, r, ...]` per response token right-padded to
    response_len; `[rows, seq, ...]` per input token (a MoE's routes) padded on both sides, as trim_padding cut it."""
    mb_width, mb_response = mb.batch["input_ids"].shape[-1], mb.batch["responses"].shape[-1]
    if t.dim() == 2 or t.shape[1] == mb_response:  # per response token (a teacher's top-k: `[rows, r, k]`)
        return pad_responses(t, response_len)
    left = (width - response_len) - (mb_width - mb_response)
    return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (left, response_len - mb_response))


def mini_batch_counts(mask: torch.Tensor, engine: TrainEngine) -> tuple[float, float]:
    """(valid tokens, sequences with a valid token) of a mini-batch summed over every data-parallel rank's share of
    it: the normalisers that make the sum of micro-batch losses equal the mini-batch loss (rlcore.algos.agg). A row
    whose every token was rejected is no sample (as verl). Summed over the data-parallel group only: TP/PP peers
    hold the same share."""
    counts = [float(mask.sum()), float((mask.sum(-1) > 0).sum())]
    return tuple(all_reduce_values(counts, group=engine.dp_group) if dist.is_initialized() else counts)


def run_ppo_updates(engine: TrainEngine, data: DataProto, epochs: int, mini_batch_rows: int, micro: MicroBatchSpec,
                    make_loss_fn: Callable[[tuple[float, float]], LossFn], prefix: str, request: TokenRequest = TokenRequest(),
                    shuffle_seed: int | None = None) -> dict[str, float]:
    """epochs x mini-batches x micro-batches of a loss, one optimizer step per mini-batch; the mean of each metric.

    `data` is this rank's share; `make_loss_fn(counts)` builds a mini-batch's loss from its global counts.
    `shuffle_seed` (verl's `<role>.shuffle` with its `data_loader_seed`): each epoch deals this rank's rows into
    mini-batches in an order drawn from the seed and the epoch, as verl's shuffled mini-batch loader does; None keeps
    the batch's order (its balanced one) every epoch.

    A mini-batch without a valid token on any rank (rollout rejection took every token: `response_mask` all 0) has
    no loss and no gradient: it is not run, and its step is skipped (engine.optimizer_step(skip=True): an AdamW step
    on a zero gradient would still move the weights by momentum and weight decay), so the update is exactly the
    one without that mini-batch; the lr schedule still advances. `{prefix}/empty_mini_batches` is their share,
    also counted in `{prefix}/skipped_steps`; the loss metrics average the mini-batches that ran. The decision
    rests on the all-reduced counts, so every rank skips alike.
    """
    history: dict[str, list[float]] = defaultdict(list)
    for epoch in range(epochs):
        if shuffle_seed is not None:
            data = data.reorder(torch.randperm(len(data), generator=torch.Generator().manual_seed(shuffle_seed + epoch)))
        for mini in data.split(mini_batch_rows):
            counts = mini_batch_counts(mini.batch["response_mask"], engine)
            empty = counts[0] == 0
            history[f"{prefix}/empty_mini_batches"].append(float(empty))
            per_micro = [] if empty else engine.forward_backward(make_micro_batches(mini, micro)[0], make_loss_fn(counts), request)
            # Each micro-batch metric is its (dp-scaled) share of the mini-batch value: summing over micro-batches
            # gives this rank's contribution, and the controller's mean over ranks completes the exact value.
            for key in (per_micro[0] if per_micro else ()):
                reduce = metric_reduction(key)
                history[key].append(sum(m[key] for m in per_micro) if reduce is np.mean else reduce([m[key] for m in per_micro]))
            step = engine.optimizer_step(skip=empty)
            history[f"{prefix}/grad_norm"].append(step["grad_norm"])
            history[f"{prefix}/lr"].append(step["lr"])
            history[f"{prefix}/skipped_steps"].append(step["skipped_step"])
    return {k: float(metric_reduction(k)(v)) for k, v in history.items()}


def rng_state_path(path: str, rank: int) -> str:
    return os.path.join(path, f"rng_rank{rank}.pt")


def save_rng_state(path: str, rank: int, extra: dict | None = None) -> None:
    """This rank's RNGs (+ `extra`: tensors, lists and numbers only, read back without pickle)."""
    torch.save({**rng_state(), **(extra or {})}, rng_state_path(path, rank))


def load_rng_state(path: str, rank: int) -> dict:
    """Restores the process RNGs; returns the whole saved dict (with any extra state)."""
    state = checkpoint_load(rng_state_path(path, rank))
    set_rng_state(state)
    return state
