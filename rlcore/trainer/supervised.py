"""The controller side of supervised training (reward models on pairs, SFT on prompt/response rows): shuffled
batches to a worker group, validation, checkpoints, resume and the HF export; `run_supervised` is a whole run
(config checks and tokenisation before Ray starts, Ray cleaned up on any exit).

A checkpoint step holds `{role}/` (each rank's sharded engine state and RNG), `{role}/huggingface/` and
`trainer_state.json` (the step, its metrics, and the stop rule that ended the run there if one did). The batch
order is a function of the seed alone, so a resumed run replays the permutations up to its step and then trains
exactly the batches the uninterrupted run would have."""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable

import numpy as np

from rlcore.config import ConfigError
from rlcore.config.rm_schema import stop_rule_met
from rlcore.models.vision import vision_processor
from rlcore.trainer.lifecycle import resume_from
from rlcore.trainer.preemption import EXIT_CODE, DeferredStop, StopNow, deferred_stop, resume_hint, say, stop_line
from rlcore.utils import checkpoint

STATE_FILE = "trainer_state.json"


class SupervisedTrainer:
    """`train` / `val`: datasets with `len()` and `batch(index, pad_token_id, max_length) -> DataProto`; the group
    has `train_batch`, `evaluate` (metric means) and `save_checkpoint`. `role` names the checkpoint folder."""

    def __init__(self, cfg, group, train, val, pad_token_id: int, tracker, total_steps: int, role: str, resume_from: str | None = None) -> None:
        self.cfg, self.group, self.train, self.val, self.pad, self.tracker = cfg, group, train, val, pad_token_id, tracker
        self.total_steps, self.role, self.resume_from = total_steps, role, resume_from
        self.world = group.world_size
        self.rng = np.random.default_rng(cfg.data.seed if cfg.data.seed is not None else cfg.trainer.seed)

    def batches(self):
        """Row indices of each step: a fresh permutation per epoch, the last partial batch dropped."""
        size = self.cfg.data.train_batch_size
        while True:
            order = self.rng.permutation(len(self.train)) if self.cfg.data.shuffle else np.arange(len(self.train))
            for start in range(0, len(order) - size + 1, size):
                yield order[start : start + size].tolist()

    def fit(self) -> dict[str, float]:
        """Trains to total_steps, or to the first validation where trainer.stop_metric reaches stop_threshold;
        returns the last step's metrics with `step` and `checkpoint` (that step's HF export)."""
        t = self.cfg.trainer
        metrics: dict[str, float] = {}
        batches = self.batches()
        start, finished = self.resume(batches)
        if finished is not None:
            return finished
        with deferred_stop() as stop:
            for step in range(start + 1, self.total_steps + 1):
                metrics = self.group.train_batch(self.train.batch(next(batches), self.pad, self.cfg.data.max_length))
                last = step == self.total_steps
                if self.val is not None and (last or t.test_freq > 0 and step % t.test_freq == 0):
                    metrics.update(self.validate())
                    if not last and stop_rule_met(t, metrics):
                        print(f"{self.role}: {t.stop_metric}={metrics[t.stop_metric]:.4f} reached trainer.stop_threshold={t.stop_threshold} "
                              f"at step {step}; stopping", flush=True)
                        last = True
                saved = last or t.save_freq > 0 and step % t.save_freq == 0
                if saved:
                    metrics["checkpoint"] = self.save(step, metrics, stopped_by=self.stop_rule() if last and step < self.total_steps else None)
                self.tracker.log({k: v for k, v in metrics.items() if k != "checkpoint"}, step=step)
                self.tracker.advance()
                if stop.requested:  # SIGTERM came during this step: checkpoint it and exit (rlcore.trainer.preemption)
                    self.stop_for_signal(stop, step, metrics, saved)
                if last:
                    break
        return dict(metrics, step=step)

    def stop_for_signal(self, stop: DeferredStop, step: int, metrics: dict[str, float], saved: bool) -> None:
        """Checkpoints the step just finished (unless it was just saved), prints the stop line and exits EXIT_CODE."""
        if not saved:
            self.save(step, metrics, stopped_by=None)
        folder = checkpoint.step_dir(os.path.abspath(self.cfg.trainer.default_local_dir), step)
        say(stop_line(step, self.total_steps, folder, stop.seconds_since_signal(), resume_hint(self.cfg.trainer, folder)))
        raise SystemExit(EXIT_CODE)

    def stop_rule(self) -> str | None:
        t = self.cfg.trainer
        return None if t.stop_metric is None else f"{t.stop_metric} {'>=' if t.stop_mode == 'max' else '<='} {t.stop_threshold}"

    def resume(self, batches) -> tuple[int, dict | None]:
        """Loads `resume_from` (if any) and advances `batches` past its steps: (steps done, the final metrics if
        that run had already finished). A finished run is one at total_steps, or one that its stop rule ended
        (a longer run, or one with another stop rule, continues from it instead)."""
        if self.resume_from is None:
            return 0, None
        state = json.load(open(os.path.join(self.resume_from, STATE_FILE)))
        if state["step"] >= self.total_steps or state["stopped_by"] is not None and state["stopped_by"] == self.stop_rule():
            print(f"{self.role}: the run in {self.resume_from} has finished; nothing to train", flush=True)
            return state["step"], dict(state["metrics"], step=state["step"], checkpoint=os.path.join(self.resume_from, self.role, "huggingface"))
        self.group.load_checkpoint(os.path.join(self.resume_from, self.role))
        for _ in range(state["step"]):
            next(batches)
        print(f"{self.role}: resumed from {self.resume_from} at step {state['step']}", flush=True)
        return state["step"], None

    def validate(self) -> dict[str, float]:
        """The group's validation metrics over the held-out rows (at most data.val_max_rows), averaged by rows."""
        limit = self.cfg.data.val_max_rows or len(self.val)
        usable = min(limit, len(self.val)) // self.world * self.world  # every rank gets the same number of whole rows
        metrics, size = {}, self.cfg.data.train_batch_size
        totals: dict[str, float] = {}
        for start in range(0, usable, size):
            index = list(range(start, min(start + size, usable)))
            for key, value in self.group.evaluate(self.val.batch(index, self.pad, self.cfg.data.max_length)).items():
                totals[key] = totals.get(key, 0.0) + value * len(index)
        metrics.update({k: v / usable for k, v in totals.items()})
        metrics["val/rows"] = usable
        return metrics

    def save(self, step: int, metrics: dict[str, float], stopped_by: str | None) -> str:
        """global_step_N/{role}/ (sharded state) + {role}/huggingface/ (the HF model: for a reward model an
        *ForSequenceClassification with one label, for SFT the causal LM) + trainer_state.json."""
        root = os.path.abspath(self.cfg.trainer.default_local_dir)
        tmp = checkpoint.begin(root, step, role=self.role)
        hf_dir = os.path.join(tmp, self.role, "huggingface")
        self.group.save_checkpoint(os.path.join(tmp, self.role), hf_dir)
        with open(os.path.join(hf_dir, "rlcore_training.json"), "w") as f:
            json.dump({"step": step, "role": self.role, "base_model": self.cfg.model.path}, f)
        with open(os.path.join(tmp, STATE_FILE), "w") as f:
            json.dump({"step": step, "stopped_by": stopped_by, "metrics": {k: v for k, v in metrics.items() if k != "checkpoint"}}, f)
        return os.path.join(checkpoint.publish(root, step, tmp, self.cfg.trainer.max_ckpt_to_keep), self.role, "huggingface")


def resume_point(trainer_cfg) -> tuple[str | None, int]:
    """(checkpoint folder to resume from or None, its step) under trainer.resume_mode (checkpoint.resume_from)."""
    path = resume_from(trainer_cfg)
    return (None, 0) if path is None else (path, json.load(open(os.path.join(path, STATE_FILE)))["step"])


def run_supervised(cfg, run_dir: str, role: str, worker_cls: type, load_data: Callable, errors: list[str], console_keys: tuple[str, ...]) -> dict:
    """One supervised run; returns the last step's metrics with `checkpoint`: the HF export (copied to
    trainer.export_dir when set). `load_data(cfg, tokenizer) -> (train, val)` tokenizes before Ray starts."""
    from rlcore.config.key_status import ineffective_settings
    from rlcore.models.hf import load_tokenizer, resolve_model_path

    try:
        cfg.model.path = resolve_model_path(cfg.model.path, "model.path")
    except FileNotFoundError as err:
        errors.append(str(err))
    if errors:
        raise ConfigError(errors)
    for line in ineffective_settings(cfg):
        print(f"WARNING rlcore: {line}", flush=True)
    cfg.trainer.default_local_dir = os.path.abspath(os.path.expanduser(cfg.trainer.default_local_dir))
    # the one loader the PPO trainer's roles use too
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
    train, val = load_data(cfg, tokenizer)
    steps_per_epoch = len(train) // cfg.data.train_batch_size
    if steps_per_epoch == 0:
        raise ConfigError([f"data.train_batch_size={cfg.data.train_batch_size} is more than the {len(train)} training rows"])
    total_steps = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * steps_per_epoch
    print(f"{role}: {len(train)} training rows, {len(val) if val else 0} validation rows, {total_steps} steps of "
          f"{cfg.data.train_batch_size}", flush=True)

    from rlcore.config.typed import typed
    from rlcore.trainer.lifecycle import build_groups, run_session, teardown

    resume_from, start_step = resume_point(cfg.trainer)
    t = cfg.trainer
    with run_session(cfg, run_dir, total_steps, start_step=start_step, console_keys=console_keys) as tracker:
        groups, pools = build_groups(t, typed(cfg, worker_cls.schema), [(t.nnodes, t.n_gpus_per_node)], {role: 0},
                                     {role: worker_cls}, check_dir=True)
        graceful = True
        try:
            groups[role].init_model(total_steps)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            final = SupervisedTrainer(cfg, groups[role], train, val, pad, tracker, total_steps, role, resume_from).fit()
        except StopNow:
            graceful = False  # a second SIGTERM: the ranks may be mid-collective, kill them
            raise
        finally:
            teardown(groups, pools, graceful=graceful)
    tokenizer.save_pretrained(final["checkpoint"])
    processor = vision_processor(cfg.model.path)  # a vision-language model's, beside its weights
    if processor is not None:
        processor.save_pretrained(final["checkpoint"])
    if cfg.trainer.export_dir:
        export = os.path.abspath(os.path.expanduser(cfg.trainer.export_dir))
        shutil.rmtree(export, ignore_errors=True)
        shutil.copytree(final["checkpoint"], export)
        final["checkpoint"] = export
    print(f"{role} model saved to {final['checkpoint']}", flush=True)
    return final
