"""The single controller's PPO/GRPO loop: `fit()` drives worker groups through one step after another."""

from __future__ import annotations

import os
import time
import uuid
from contextlib import closing, nullcontext

import numpy as np
import torch

from rlcore.algos import compute_advantage, kl_penalty, make_kl_controller, rollout_correction
from rlcore.algos.group_filter import informative_samples
from rlcore.algos.pf_ppo import pf_ppo_rows
from rlcore.config.async_schema import always_fresh
from rlcore.config.tool_config import tools_enabled
from rlcore.config.typed import dotted
from rlcore.config.validate import uses_reference
from rlcore.data.seqlen_balancing import balanced_order
from rlcore.models.router import ROUTES
from rlcore.models.vision import MEDIA_COLUMNS, MULTI_MODAL_INPUTS
from rlcore.plan.run_plan import RunPlan, on_policy
from rlcore.protocol import DataProto
from rlcore.reward.manager import component_columns
from rlcore.rollout.agent_loop import TURN_COUNTERS, agent_columns
from rlcore.telemetry.perf import StepPerf, start_step_perf, timer
from rlcore.trainer.colocate_async import ColocatedAsync
from rlcore.trainer.distillation import TeacherScoring
from rlcore.trainer.dynamic_sampling import GroupCollector, sample_metric
from rlcore.trainer.generation_dump import dump_generations
from rlcore.trainer.lifecycle import resume_from
from rlcore.trainer.metrics import data_metrics, gradient_variance_metrics, multi_turn_metrics, throughput_metrics
from rlcore.trainer.preemption import EXIT_CODE, DeferredStop, deferred_stop, resume_hint, say, stop_line
from rlcore.trainer.profiling import Profiling
from rlcore.trainer.split_pools import SplitPools
from rlcore.trainer.val_metrics import concat_columns, process_validation_metrics, sectioned_metrics
from rlcore.utils import checkpoint
from rlcore.workers.teacher import TEACHER_COLUMNS

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]
FORWARD_KEYS = PROMPT_KEYS + ["responses"]  # what a log-prob pass needs (input_ids here span prompt + response)
UPDATE_KEYS = FORWARD_KEYS + ["response_mask", "advantages"]  # + old_log_probs unless the step is exactly on-policy
CRITIC_KEYS = FORWARD_KEYS + ["response_mask", "values", "returns"]


def actor_keys(batch: DataProto, keys: list[str]) -> list[str]:
    """`keys` of an actor pass (old or reference log-probs, the update), with the routes a mixture of experts replays
    when the batch has them (router replay: the rollout's, R3, or the old-log-prob pass's, R2)."""
    return keys + [ROUTES] if ROUTES in batch.batch.keys() else keys


def actor_data(batch: DataProto, keys: list[str]) -> DataProto:
    """The batch an actor pass reads: `keys` (actor_keys) and a vision-language policy's images as the processor made
    them (the forward scatters their features into the image tokens)."""
    return batch.select(actor_keys(batch, keys), [k for k in (MULTI_MODAL_INPUTS,) if k in batch.non_tensor_batch])


def to_proto(batch: dict) -> DataProto:
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return DataProto.from_dict(tensors, {k: v for k, v in batch.items() if k not in tensors})


class PPOTrainer:
    def __init__(self, cfg, groups: dict, reward_fn, val_reward_fn, train_loader, val_loader, tracker, total_steps: int,
                 restart: bool = False, restart_from: str | None = None, val_history: list[tuple[int, float]] | None = None,
                 plan: RunPlan | None = None) -> None:
        """`groups`: worker groups by role ("actor_rollout", optionally "critic"). `plan`: the run's (rlcore.train
        derives it as it checks the config; the step report shows its memory plan beside the measured ledger).
        `restart`: this run's workers died and were replaced. Continue from `restart_from` (a checkpoint this run
        wrote; None: it died before the first save, so start over) and never from another run's checkpoint."""
        self.cfg, self.plan = cfg, plan
        self.groups = groups
        self.actor_rollout = groups["actor_rollout"]
        self.critic = groups.get("critic")
        self.reward_model = groups.get("reward_model")
        # On-policy distillation: the teacher group scores each step's samples (rlcore.trainer.distillation)
        self.teacher = TeacherScoring(cfg, groups["teacher"]) if "teacher" in groups else None
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.train_loader, self.val_loader = train_loader, val_loader
        self.tracker = tracker
        self.total_steps = total_steps
        self.use_ref = uses_reference(cfg)
        # Exactly on-policy (rlcore.plan.run_plan.on_policy, the run plan's): the old-log-prob pass is skipped and the
        # loss uses the update's own log-probs detached (verl's actor does the same on-policy, after running the
        # pass anyway).
        rc = cfg.algorithm.rollout_correction
        self.rollout_corr, self.bypass = rc, rc.bypass_mode
        self.on_policy = plan.on_policy if plan is not None else on_policy(cfg)
        # Split pools: the rollout group generates (a background thread; rlcore.trainer.split_pools). Samples may
        # then be stale; the old policy is then the rollout's own log-probs (use_rollout_log_probs: bypass) or a
        # pass with the trainer's weights (compute_prox_log_prob).
        self.rollout_group = groups.get("rollout")
        self.split = None
        if self.rollout_group is not None:
            self.split = SplitPools(cfg, self.actor_rollout, self.rollout_group, lambda m: self.generate_and_score(self.next_batch(), m, timer)[0])
            a = cfg.async_training
            if not always_fresh(dotted(cfg)):
                self.bypass = self.bypass or (a.use_rollout_log_probs and not a.compute_prox_log_prob)
        # verl 0.9's colocate_async: generations carried across steps on the hybrid workers (rlcore.trainer.colocate_async)
        self.colocated = ColocatedAsync(cfg, self.actor_rollout) if cfg.trainer.v1.trainer_mode == "colocate_async" else None
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl)
        self.multi_turn = tools_enabled(cfg)  # rollouts run the agent loop: rows carry their tools_kwargs
        self.interactions = bool(cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path)
        self.custom_loops = bool(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)  # rows carry every column
        self.global_step = 0
        self.val_history: list[tuple[int, float]] = list(val_history or [])  # (step, mean validation score)
        self.restart, self.restart_from = restart, restart_from
        self.last_checkpoint: str | None = None  # written by this run: where a restart resumes
        self.perf = StepPerf(groups, None, None, None, {})  # fit() measures the device and writes perf.json
        self.profiling = Profiling(cfg, groups)  # global_profiler.steps: the workers' profilers around those steps
        self._batches = iter(())

    def fit(self) -> dict[str, float]:
        """Resume if asked, validate, then train until total_steps; returns the last step's metrics."""
        if self.restart_from:
            self.load_checkpoint(self.restart_from)
        elif not self.restart:
            self.maybe_resume()
        self.perf = start_step_perf(self.cfg, self.groups, os.path.dirname(self.tracker.jsonl_path),
                                    self.plan.planned_peaks if self.plan else {})
        metrics: dict[str, float] = {}
        if self.split is not None:
            self.split.connect(self.global_step)
        if not self.restart and (self.cfg.trainer.val_before_train or self.cfg.trainer.val_only) and self.val_loader is not None:
            self.tracker.log(self.validate(), step=self.global_step)
        if self.cfg.trainer.val_only:
            return metrics
        if self.split is not None:
            self.split.start()
        start = time.perf_counter()
        # split.close() stops the rollouter thread however the loop ends
        with (deferred_stop() as stop, closing(self.split) if self.split is not None else nullcontext(),
              closing(self.teacher) if self.teacher is not None else nullcontext()):
            while self.global_step < self.total_steps:
                self.global_step += 1
                with self.profiling.step(self.global_step):
                    metrics = self.train_step()
                last = self.global_step == self.total_steps
                if self.split is not None:
                    self.split.after_step(self.global_step, metrics, self._due(self.cfg.trainer.test_freq, last) and self.val_loader is not None, last)
                saved = self._due(self.cfg.trainer.save_freq, last)
                with self.quiet_rollout():
                    if self._due(self.cfg.trainer.test_freq, last) and self.val_loader is not None:
                        with self.perf.phase("testing", metrics):
                            metrics.update(self.validate())
                    if saved:
                        with self.perf.phase("save_checkpoint", metrics):
                            self.save_checkpoint()
                metrics.update(self.perf.end_step(self.global_step, metrics))
                metrics["timing_s/elapsed"] = time.perf_counter() - start  # wall clock since the first step began
                self.tracker.log(metrics, step=self.global_step)
                self.tracker.advance()
                if stop.requested:  # SIGTERM came during this step: checkpoint it and exit (rlcore.trainer.preemption)
                    self.stop_for_signal(stop, saved)
        return metrics

    def stop_for_signal(self, stop: DeferredStop, saved: bool) -> None:
        """Checkpoints the step just finished (unless save_freq just did), prints the stop line and exits EXIT_CODE."""
        if not saved:
            with self.quiet_rollout():
                self.save_checkpoint()
        say(stop_line(self.global_step, self.total_steps, self.last_checkpoint, stop.seconds_since_signal(),
                      resume_hint(self.cfg.trainer, self.last_checkpoint)))
        raise SystemExit(EXIT_CODE)

    def quiet_rollout(self):
        """Split pools: no generation in flight (validation shares the rollout pool; a checkpoint its data position)."""
        return self.split.quiet() if self.split is not None else nullcontext()

    def _due(self, freq: int, last: bool) -> bool:
        return freq > 0 and (self.global_step % freq == 0 or last)

    def next_batch(self) -> DataProto:
        """The next prompt batch; a finished epoch rolls over into the next (total_steps bounds the run)."""
        batch = next(self._batches, None)
        if batch is None:
            self._batches = iter(self.train_loader)
            batch = next(self._batches)
        return to_proto(batch)

    # ------------------------------------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        metrics: dict[str, float] = {"training/global_step": self.global_step}
        with timer("step", metrics):
            batch = self.collect_samples(metrics)
            metrics["training/epoch"] = self.train_loader.epoch
            if self.cfg.trainer.balance_batch:
                batch = self.balance_batch(batch, metrics)
            updates_actor = self.global_step > self.cfg.trainer.critic_warmup
            # On a pool of its own the teachers score while the actor computes old and reference log-probs.
            teaching = self.teacher.start(batch) if self.teacher is not None else None
            if self.bypass and "rollout_log_probs" in batch.batch.keys():
                # verl's bypass mode: the rollout's own log-probs are the old policy, so the PPO ratio is taken
                # against the policy that really sampled (no old-log-prob pass; the mismatch is measured by the actor).
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
            elif not (self.on_policy and updates_actor):
                with self.perf.phase("old_log_prob", metrics):
                    old = self.actor_rollout.compute_log_prob(actor_data(batch, FORWARD_KEYS))
                    metrics.update(old.meta_info.pop("memory", {}))
                    entropy = old.pop(["entropys"]).batch["entropys"]
                    metrics["actor/entropy"] = (entropy * batch.batch["response_mask"]).sum().item() / batch.batch["response_mask"].sum().item()
                    batch.union(old)
            if self.use_ref:
                with self.perf.phase("ref", metrics):
                    ref = self.actor_rollout.compute_ref_log_prob(actor_data(batch, FORWARD_KEYS))
                    metrics.update(ref.meta_info.pop("memory", {}))
                    batch.union(ref)
            if self.critic is not None:
                with self.perf.phase("values", metrics):
                    batch.union(self.critic.compute_values(batch.select(FORWARD_KEYS + ["response_mask"])))
            if self.teacher is not None:  # the time the step waits for the teachers (all of it when they share devices)
                with self.perf.phase("teacher", metrics):
                    self.teacher.finish(batch, metrics, teaching)
            with self.perf.phase("adv", metrics):
                metrics.update(self.correct_rollout(batch))  # its IS weights scale OTB's path weights
                metrics.update(self.compute_advantage(batch))
            if self.critic is not None:
                with self.perf.phase("update_critic", metrics):
                    metrics.update(self.critic.update_critic(batch.select(CRITIC_KEYS)))
            if updates_actor:
                with self.perf.phase("update_actor", metrics):
                    metrics.update(self.actor_rollout.update_actor(self.actor_batch(batch)))
        self.train_loader.update(batch)  # a curriculum sampler (data.sampler) hears how the step's prompts scored
        self.perf.count_tokens(batch)
        metrics.update(data_metrics(batch))
        metrics.update(multi_turn_metrics(batch))
        metrics.update(gradient_variance_metrics(batch, metrics.get("actor/grad_norm")))
        metrics.update(throughput_metrics(batch, metrics["timing_s/step"], self.actor_rollout.world_size))
        return metrics

    def collect_samples(self, metrics: dict[str, float]) -> DataProto:
        """The step's generated and scored samples: one generation batch, or with algorithm.filter_groups (DAPO's
        dynamic sampling) the informative groups of as many batches as it takes to fill data.train_batch_size."""
        if self.split is not None:
            return self.split.take(metrics, self.global_step)
        if self.colocated is not None:  # verl 0.9's colocate_async: the groups that finish first, the rest carried on
            new = [self.prepare_prompts(self.next_batch(), metrics) for _ in range(self.colocated.batches_due())]
            with self.perf.phase("gen", metrics):
                batch = self.colocated.take(new, metrics, self.global_step)
            return self.score(batch, metrics)[0]
        groups = self.cfg.algorithm.filter_groups
        if not groups.enable:
            return self.generate_and_score(self.next_batch(), metrics)[0]
        n = self.cfg.actor_rollout_ref.rollout.n
        collector = GroupCollector(self.cfg.data.train_batch_size, n, groups.max_num_gen_batches)
        while True:
            batch, extras = self.generate_and_score(self.next_batch(), metrics)
            collector.add(batch, informative_samples(batch.non_tensor_batch["uid"], sample_metric(batch, groups.metric, extras)))
            if collector.done():
                metrics.update({"train/num_gen_batches": collector.num_gen_batches,
                                "train/kept_group_ratio": collector.prompts / collector.num_groups_seen})
                return collector.batch()

    def generate_and_score(self, batch: DataProto, metrics: dict[str, float], phase=None) -> tuple[DataProto, dict[str, list[float]]]:
        """rollout.n samples per prompt (one uid per prompt's group), with token_level_scores; and the scorer's extras.
        `phase`: how each part is timed (the step's phases; the split pools' rollouter thread passes a plain timer)."""
        phase = phase or self.perf.phase
        batch = self.prepare_prompts(batch, metrics, phase)
        with phase("gen", metrics):
            batch = self.generate(batch, metrics=metrics)
        return self.score(batch, metrics, phase)

    def prepare_prompts(self, batch: DataProto, metrics: dict[str, float], phase=None) -> DataProto:
        """rollout.n rows per prompt, a uid per prompt's group (and ReMax's greedy baseline per prompt)."""
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        if self.cfg.algorithm.adv_estimator == "remax":
            with (phase or self.perf.phase)("gen_max", metrics):
                batch.batch["reward_baselines"] = self.greedy_baseline(batch)
        return batch.repeat(self.cfg.actor_rollout_ref.rollout.n, interleave=True)

    def score(self, batch: DataProto, metrics: dict[str, float], phase=None) -> tuple[DataProto, dict[str, list[float]]]:
        """The generated batch with its token_level_scores (and the reward model's), and the scorer's extras."""
        phase = phase or self.perf.phase
        if self.reward_model is not None:
            with phase("reward_model", metrics):
                raw = [k for k in ("raw_prompt",) if k in batch.non_tensor_batch]  # re-rendered if the RM's template differs
                rm = self.reward_model.compute_rm_score(batch.select(FORWARD_KEYS + ["response_mask"], raw, meta_keys=[]))
                metrics.update(rm.meta_info.pop("timing", {}))
                batch.union(rm)
        with phase("reward", metrics):
            scores, extras = self.reward_fn(batch)
            batch.batch["token_level_scores"] = scores
            algo = self.cfg.algorithm
            if algo.adv_estimator == "gdpo":  # its reward dimensions, as columns that follow their samples through filtering
                batch.non_tensor_batch.update(component_columns(extras, algo.gdpo_reward_keys, self.cfg.reward_model.error_score))
        metrics.update(self.reward_fn.health)
        if self.cfg.trainer.rollout_data_dir:
            dump_generations(self.cfg.trainer.rollout_data_dir, self.global_step, self.reward_fn, batch, scores, extras)
        return batch, extras

    def generate(self, batch: DataProto, validate: bool = False, greedy: bool = False, metrics: dict | None = None) -> DataProto:
        """Responses for the batch's prompts: validation sampling (val_kwargs), greedy, or training sampling."""
        prompts = batch.pop(PROMPT_KEYS)
        prompts.meta_info.update(validate=validate, greedy=greedy)
        for key in MEDIA_COLUMNS:  # a vision-language policy's images (vLLM's) and processor tensors (the native engine's)
            if key in batch.non_tensor_batch:
                prompts.non_tensor_batch[key] = batch.non_tensor_batch[key]
        if self.custom_loops:  # verl hands a loop every column of its row (raw_prompt, extra_info, agent_name, ...)
            prompts.non_tensor_batch.update(batch.non_tensor_batch)
        if self.multi_turn or self.custom_loops:
            prompts.non_tensor_batch.update(agent_columns(batch.non_tensor_batch, self.interactions))
        out = (self.rollout_group or self.actor_rollout).generate_sequences(prompts)
        if metrics is not None:
            metrics.update(out.meta_info["timing"])  # rank 0's weight-sync and generation seconds, KV slots, prefills
            metrics.update(out.meta_info["memory"])  # rank 0's memory ledger (rlcore.workers.phases)
        out.meta_info.clear()
        return batch.union(out)

    def balance_batch(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """Reorders samples so each actor data-parallel rank's chunk holds about the same number of tokens: with
        skewed response lengths the rank that drew the long ones would otherwise set every pass's pace."""
        order, stats = balanced_order(batch.batch["attention_mask"].sum(-1).tolist(), self.actor_rollout.dp_size("actor"))
        metrics.update(stats)
        return batch.reorder(order)

    def greedy_baseline(self, batch: DataProto) -> torch.Tensor:
        """ReMax's baseline: the score of each prompt's greedy response `[prompts]` (one extra generation)."""
        prompts = batch.select(PROMPT_KEYS, batch.non_tensor_batch.keys())
        scores, _ = self.reward_fn(self.generate(prompts, greedy=True))
        return scores.sum(-1)

    def correct_rollout(self, batch: DataProto) -> dict[str, float]:
        """verl's decoupled rollout correction: with the trainer's old log-probs and the rollout's for the same
        tokens, the `rollout_corr/*` mismatch metrics, and if configured the truncated IS weights
        (`rollout_is_weights`) and the rejection mask (`rollout_rs_mask`, the update's response mask; the step's
        data metrics keep counting every sampled token). Without the old-log-prob pass (on-policy, bypass_mode) the
        actor measures the mismatch against the log-probs of its own forward instead."""
        b, rc = batch.batch, self.rollout_corr
        if self.bypass or "old_log_probs" not in b.keys() or "rollout_log_probs" not in b.keys():
            return {}
        weights, mask, metrics = rollout_correction(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"], rc.rollout_is,
                                                    rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold, rc.rollout_is_batch_normalize)
        if weights is not None:
            b["rollout_is_weights"] = weights
        if rc.rollout_rs is not None:
            b["rollout_rs_mask"] = mask
        return metrics

    def actor_batch(self, batch: DataProto) -> DataProto:
        """The columns the actor update reads; the rejection mask, if any, as its response mask."""
        present = batch.batch.keys()
        keys = UPDATE_KEYS + (["ref_log_prob"] if self.use_ref else [])
        keys += [k for k in ("old_log_probs", "rollout_is_weights", *TEACHER_COLUMNS) if k in present]
        if "rollout_log_probs" in present and (self.bypass or "old_log_probs" not in present):
            keys.append("rollout_log_probs")  # the actor measures the mismatch (see correct_rollout)
        data = actor_data(batch, keys)
        # The one on-policy decision (see __init__), handed to the actor: its loss then uses its own log-probs, detached.
        data.meta_info["on_policy"] = "old_log_probs" not in present
        if "rollout_rs_mask" in present:
            data.batch["response_mask"] = batch.batch["rollout_rs_mask"]
        return data

    def compute_advantage(self, batch: DataProto) -> dict[str, float]:
        """Token-level rewards (score, minus a KL penalty if use_kl_in_reward), then the configured estimator."""
        b, algo, metrics = batch.batch, self.cfg.algorithm, {}
        rewards = b["token_level_scores"]
        if algo.use_kl_in_reward:
            kl = kl_penalty(b["old_log_probs"], b["ref_log_prob"], algo.kl_penalty) * b["response_mask"]
            rewards = rewards - self.kl_ctrl.value * kl
            current_kl = (kl.sum(-1) / b["response_mask"].sum(-1).clamp(min=1)).mean().item()
            self.kl_ctrl.update(current_kl, n_steps=len(batch))
            metrics.update({"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value})
        b["token_level_rewards"] = rewards
        components = None
        if algo.adv_estimator == "gdpo":  # [samples, dimensions], in gdpo_reward_keys' order
            components = np.stack([batch.non_tensor_batch[key].astype(np.float64) for key in algo.gdpo_reward_keys], axis=1)
        b["advantages"], b["returns"] = compute_advantage(
            algo.adv_estimator, token_level_rewards=rewards, response_mask=b["response_mask"],
            index=batch.non_tensor_batch["uid"], norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, config=algo,
            values=b.get("values", None), reward_baselines=b.get("reward_baselines", None),
            old_log_probs=b.get("old_log_probs", None), sum_pi_squared=b.get("sum_pi_squared", None),
            rollout_is_weights=b.get("rollout_is_weights", None), reward_components=components,
            reward_weights=algo.gdpo_reward_weights,
        )
        if algo.use_pf_ppo:  # verl redraws the batch in its GAE path (validation refuses any other estimator)
            seeded = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + self.global_step)
            rows = pf_ppo_rows(b["token_level_scores"].sum(-1), algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow, seeded)
            drawn = batch.index(rows)  # in place: the step's batch is the caller's
            batch.batch, batch.non_tensor_batch = drawn.batch, drawn.non_tensor_batch
            metrics["pf_ppo/unique_sample_fraction"] = len(set(rows.tolist())) / len(rows)
        return metrics

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """val_kwargs.n generations (greedy by default) per validation prompt, scored by val_reward_fn; verl's metrics
        per data source (rlcore.trainer.val_metrics), and the generations in trainer.validation_data_dir if set."""
        n, trainer = self.cfg.actor_rollout_ref.rollout.val_kwargs.n, self.cfg.trainer
        sources, prompt_ids, columns = [], [], []
        samples: list[tuple[str, str, float]] = []
        for raw in self.val_loader:
            prompts = to_proto(raw)
            batch = self.generate(prompts.repeat(n, interleave=True), validate=True)
            scores, extras = self.val_reward_fn(batch)
            sources.extend(batch.non_tensor_batch[self.cfg.data.reward_fn_key])
            prompt_ids.extend(np.repeat(np.arange(len(prompts)) + len(prompt_ids) // n, n))  # interleaved: a prompt's n are adjacent
            columns.append({"reward": scores.sum(-1).tolist(), **{k: v for k, v in extras.items() if k != "reward"},
                            **{k: batch.batch[k].tolist() for k in TURN_COUNTERS if k in batch.batch.keys()}})
            if trainer.validation_data_dir:
                dump_generations(trainer.validation_data_dir, self.global_step, self.val_reward_fn, batch, scores, extras,
                                 fresh=len(columns) == 1)
            if len(samples) < trainer.log_val_generations:
                samples.extend(self.val_reward_fn.samples(batch, scores, trainer.log_val_generations - len(samples)))
        if samples:
            self.tracker.log_generations(samples, step=self.global_step)
        by_source = process_validation_metrics(sources, prompt_ids, concat_columns(columns))
        self.val_history.append((self.global_step, float(np.mean([v["reward"][f"mean@{n}"] for v in by_source.values()]))))
        return sectioned_metrics(by_source)

    def report_end(self) -> None:
        """The run's last lines, printed after its report: the two figures a run is judged by (held-out score before
        the first RL step and after the last) and where its last checkpoint and HF model went."""
        lines = []
        if len(self.val_history) >= 2 and self.val_history[0][0] == 0:
            lines += [f"val accuracy before RL: {self.val_history[0][1]:.4f}", f"val accuracy after RL: {self.val_history[-1][1]:.4f}"]
        if self.last_checkpoint:
            lines.append(f"checkpoint: {self.last_checkpoint} (the HF model: {os.path.join(self.last_checkpoint, 'actor', 'huggingface')}); "
                         f"{resume_hint(self.cfg.trainer, self.last_checkpoint)}")
        self.tracker.closing.extend(lines)

    # ------------------------------------------------------------------------------------------------ checkpoint
    def save_checkpoint(self) -> str:
        root = os.path.abspath(self.cfg.trainer.default_local_dir)
        tmp = checkpoint.begin(root, self.global_step)
        actor_dir = os.path.join(tmp, "actor")
        self.actor_rollout.save_checkpoint(actor_dir, os.path.join(actor_dir, "huggingface"))
        if self.critic is not None:
            critic_dir = os.path.join(tmp, "critic")
            self.critic.save_checkpoint(critic_dir, os.path.join(critic_dir, "huggingface"))
        if self.rollout_group is not None:  # its sampling RNG; the samples it queued are dropped, not saved
            self.rollout_group.save_checkpoint(os.path.join(tmp, "rollout"))
        # param_version: the weights version the rollout held (split pools sync every trigger_parameter_sync_step)
        extra = {"global_step": self.global_step, "kl_coef": self.kl_ctrl.value, "val_history": self.val_history,
                 "param_version": self.split.version if self.split is not None else self.global_step}
        torch.save(checkpoint.controller_state(self.train_loader.state_dict(), extra), os.path.join(tmp, "data.pt"))
        self.last_checkpoint = checkpoint.publish(root, self.global_step, tmp, self.cfg.trainer.max_actor_ckpt_to_keep)
        return self.last_checkpoint

    def maybe_resume(self) -> None:
        path = resume_from(self.cfg.trainer)
        if path is not None:
            self.load_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.actor_rollout.load_checkpoint(os.path.join(path, "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(os.path.join(path, "critic"))
        if self.rollout_group is not None and os.path.isdir(os.path.join(path, "rollout")):
            self.rollout_group.load_checkpoint(os.path.join(path, "rollout"))
        state = checkpoint.checkpoint_load(os.path.join(path, "data.pt"))
        self.train_loader.load_state_dict(state["loader"])
        checkpoint.restore_controller_rng(state)
        self.kl_ctrl.value = state["kl_coef"]
        self.global_step = state["global_step"]
        self.val_history = state["val_history"]
        self.last_checkpoint = path
        print(f"resumed from {path} at global step {self.global_step}")
        if self.cfg.trainer.del_local_ckpt_after_load:
            checkpoint.delete_after_load(path, self.cfg.trainer.save_freq)
            self.last_checkpoint = None  # a worker restart has no checkpoint of this run to go back to until the next save
