"""The colocated actor + rollout + reference worker (verl's hybrid engine), written once over TrainEngine."""

from __future__ import annotations

import os
import time

import torch

from rlcore.algos.custom import load_custom_algorithms
from rlcore.config.lora_schema import unmerged_lora_rank
from rlcore.config.typed import dotted
from rlcore.config.validate import uses_reference
from rlcore.controller.decorator import Dispatch, register
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import CHECKPOINT_STATE
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.models.hf import import_external_lib, named_load, policy_tokenizer
from rlcore.models.hf_export import head_model_config
from rlcore.models.vision import vision_processor
from rlcore.plan.micro_plan import ACTOR_LOG_PROB, ACTOR_UPDATE, REF_LOG_PROB
from rlcore.protocol import DataProto
from rlcore.rollout.partial import PartialRollouts
from rlcore.rollout.weight_sync import send_weights, sync_adapters, sync_weights
from rlcore.utils import checkpoint
from rlcore.utils.determinism import deterministic_kernels
from rlcore.utils.dist import standalone_group
from rlcore.utils.memory import peak_memory_gib
from rlcore.workers import phases
from rlcore.workers.actor import compute_log_prob, update_policy
from rlcore.workers.common import RoleWorker, layout_of, load_rng_state, save_rng_state
from rlcore.workers.rollout_parts import build_rollout_parts, generate, sampling_params


class ActorRolloutRefWorker(RoleWorker):
    """Owns, in one process per device: the trainable policy, its rollout engine, and the frozen reference."""

    def __init__(self, config: dict, rank: int = 0, world_size: int = 1, device: str = "cpu", micro: dict | None = None) -> None:
        super().__init__(config, rank=rank, world_size=world_size, device=device, micro=micro)
        load_custom_algorithms(self.config.custom_algorithms.path)  # a user's policy loss runs here

    def full_determinism(self) -> bool:
        """Deterministic kernels for this process (rlcore.utils.determinism), which are process-wide and set before any
        kernel runs: the colocated rollout's key (the actor and reference compute on its kernels too) or the actor's or
        the reference's engine key (verl 0.9's <role>.fsdp_config.full_determinism)."""
        cfg = self.config.actor_rollout_ref
        return bool((cfg.hybrid_engine and cfg.rollout.full_determinism) or cfg.actor.fsdp_config.full_determinism
                    or (uses_reference(self.config) and cfg.ref.fsdp_config.full_determinism))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg = self.config.actor_rollout_ref
        if self.full_determinism():
            deterministic_kernels()
        seed = self.config.trainer.seed
        torch.manual_seed(seed)  # identical init on every rank before sharding
        import_external_lib(cfg.model.external_lib, "actor_rollout_ref.model.external_lib")  # registers a custom architecture
        tokenizer_key = "actor_rollout_ref.model.tokenizer_path" if cfg.model.tokenizer_path else "actor_rollout_ref.model.path"
        with named_load(tokenizer_key, cfg.model.tokenizer_path or cfg.model.path, "the tokenizer"):
            self.tokenizer = policy_tokenizer(cfg.model, cfg.model.trust_remote_code)
        actor_spec = engine_spec(cfg.actor.strategy, cfg.model, cfg.actor, cfg.actor.optim, cfg.actor.grad_clip, total_steps)
        with named_load("actor_rollout_ref.model.path", cfg.model.path):
            self.actor = build_engine(cfg.actor.strategy, actor_spec, self.device)
        self.layouts["actor"] = layout_of(self.actor)  # the reference shares the actor's layout (verl: ref follows actor)
        self.ref = None
        # With LoRA the reference is the actor's own base with the adapters off: no second copy of the weights.
        if uses_reference(self.config) and self.actor.spec.lora is None:
            ref_spec = engine_spec(cfg.ref.strategy, cfg.model, cfg.ref, None, 0.0, total_steps)
            ref_spec.ulysses_sp = actor_spec.ulysses_sp  # the actor's batches, sliced the actor's way
            with named_load("actor_rollout_ref.model.path", cfg.model.path, "the reference model"):
                self.ref = build_engine(cfg.ref.strategy, ref_spec, self.device, key="actor_rollout_ref.ref.strategy")
            phases.leave(self.ref)
        # The training state leaves the device before the rollout engine is built: vLLM sizes its KV cache from the
        # free memory it finds at start-up.
        phases.leave(self.actor)
        self.rollout, self.agent_loop = None, None
        self._used_before_rollout = phases.device_used_bytes(self.device)  # what a sleeping engine should return to
        if cfg.hybrid_engine:  # split pools: the rollout is another group's (rlcore.workers.rollout)
            self.rollout, self.agent_loop = build_rollout_parts(self.config, self.tokenizer, self.device, self.rank)
        # verl 0.9's colocate_async: this rank's rollouts in flight across steps (rlcore.rollout.partial)
        self.partials = None
        if self.config.trainer.v1.trainer_mode == "colocate_async":
            sampler = self.config.trainer.v1.sampler
            self.partials = PartialRollouts(cfg.rollout.n, sampler.max_off_policy_threshold, sampler.max_off_policy_strategy,
                                            self.tokenizer.pad_token_id)
        self._rollout_has_base = False  # LoRA: the rollout holds the frozen base weights; later syncs send adapted ones
        self._rollout_has_tower = False  # a frozen vision tower: the rollout holds it after the first sync
        # LoRA without merging (model.lora.merge=False): later syncs send the adapters alone, which the rollout applies
        self._unmerged_lora = unmerged_lora_rank(dotted(self.config)) > 0
        self.weight_group = None  # split pools: the group spanning training rank 0 and every rollout rank

    def shutdown(self) -> None:
        if getattr(self, "agent_loop", None) is not None:
            self.agent_loop.close()
        super().shutdown()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Hybrid engine: sync the current weights into the rollout model, sample, then free the cache."""
        timing = {}
        start = time.perf_counter()
        phases.reset_peak(self.device)
        bucket_bytes = self.config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes * 2**20
        adapted_only = self._rollout_has_base and self.rollout.keeps_weights
        # A frozen vision tower never changes: once the rollout holds it, later syncs leave it out.
        trainable_only = self._rollout_has_tower and self.actor.spec.freeze_vision_tower and self.rollout.keeps_unsent_modules
        phases.enter(self.actor, "sync")
        # The actor's parameters leave the device (if param_offload) between the stream and the KV cache's wake-up.
        streamed = {}
        release = lambda: phases.leave(self.actor)  # noqa: E731
        if self._unmerged_lora:
            timing["rollout/weights_synced"] = sync_adapters(self.actor, self.rollout, not self._rollout_has_base, bucket_bytes, release, streamed)
        else:
            timing["rollout/weights_synced"] = sync_weights(self.actor, self.rollout, bucket_bytes, adapted_only, release, streamed, trainable_only)
        self._rollout_has_base, self._rollout_has_tower = self.actor.spec.lora is not None, True
        timing["timing_s/update_weights"] = time.perf_counter() - start
        sampling = sampling_params(self.config, self.tokenizer, prompts.meta_info)
        if "colocate_async" in prompts.meta_info:  # {version, groups}: the step's groups, the rest carried on
            out, stats = self.partials.step(self.rollout, prompts, sampling, **prompts.meta_info["colocate_async"])
        else:
            out, stats = generate(self.rollout, self.agent_loop, prompts, sampling)
        timing.update(stats)
        memory = phases.ledger("generate", self._engines(), self.rollout, transient_bytes=max(min(bucket_bytes, streamed["bytes"]), streamed["largest"]),
                               device=self.device)
        if self.config.actor_rollout_ref.rollout.free_cache_engine:
            # Level 2 frees the rollout's weights too, unless the next sync sends only LoRA's adapted ones or adapters.
            keep = (self._rollout_has_base and (self.rollout.keeps_weights or self._unmerged_lora)
                    or self.actor.spec.freeze_vision_tower and self.rollout.keeps_unsent_modules)
            self.rollout.sleep(level=1 if keep else 2)
        timing["rollout/weights_synced_gib"] = streamed["bytes"] / 2**30
        if self.device.type == "cuda":  # the device after the rollout let go, against before the engine was built
            memory["perf/memory/rollout_asleep/device_used_gib"] = phases.device_used_bytes(self.device) / 2**30
            memory["perf/memory/before_rollout/device_used_gib"] = self._used_before_rollout / 2**30
        timing["timing_s/generate_on_rank"] = time.perf_counter() - start - timing["timing_s/update_weights"]
        out.meta_info.update(timing=timing, memory=memory)
        return out

    def _engines(self) -> dict:
        """The training engines sharing this worker's device (the memory ledger sums them)."""
        return {"actor": self.actor} | ({"ref": self.ref} if self.ref is not None else {})

    def _micro_batches(self, role: str) -> MicroBatchSpec:
        """role: "actor" (the update), "rollout" (old log-probs) or "ref"; each on the actor's engine."""
        return self.micro_batches({"actor": ACTOR_UPDATE, "rollout": ACTOR_LOG_PROB, "ref": REF_LOG_PROB}[role], self.actor)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the responses under the current policy (`old_log_probs`) and their entropy (and with
        actor.calculate_sum_pi_squared, each position's sum_v p(v)^2: `sum_pi_squared`, for the optimal token baseline)."""
        temperature = self.config.actor_rollout_ref.rollout.temperature
        phases.reset_peak(self.device)
        # R2 records the routes this pass takes, for the reference and the update to replay; R3 replays the rollout's.
        routes = {"disabled": "free", "R2": "record", "R3": "replay"}[self.config.actor_rollout_ref.actor.router_replay.mode]
        with phases.running(self.actor, "old_log_prob"):
            out = compute_log_prob(self.actor, data, self._micro_batches("rollout"), temperature, with_entropy=True, routes=routes,
                                   with_sum_pi_squared=self.config.actor_rollout_ref.actor.calculate_sum_pi_squared)
            memory = phases.ledger("old_log_prob", self._engines(), self.rollout, device=self.device)
        out = out.rename({"log_probs": "old_log_probs"})
        out.meta_info["memory"] = memory
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        temperature = self.config.actor_rollout_ref.rollout.temperature
        ref = self.ref or self.actor  # LoRA: the actor with its adapters disabled
        phases.reset_peak(self.device)
        routes = "free" if self.config.actor_rollout_ref.ref.router_replay.mode == "disabled" else "replay"
        with phases.running(ref, "ref"), ref.disabled_adapters():
            out = compute_log_prob(ref, data, self._micro_batches("ref"), temperature, with_entropy=False, routes=routes)
            memory = phases.ledger("ref", self._engines(), self.rollout, device=self.device)
        out = out.rename({"log_probs": "ref_log_prob"})
        out.meta_info["memory"] = memory
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS, mesh="actor")
    def update_actor(self, data: DataProto) -> dict[str, float]:
        cfg = self.config.actor_rollout_ref
        start = time.perf_counter()
        phases.reset_peak(self.device)
        with phases.running(self.actor, "update_actor"):
            distill = self.config.distillation.distillation_loss if self.config.distillation.enabled else None
            metrics = update_policy(self.actor, data, cfg.actor, self._micro_batches("actor"), cfg.rollout.n, cfg.rollout.temperature,
                                    self.config.algorithm.rollout_correction, distill)
            metrics.update(phases.ledger("update_actor", self._engines(), self.rollout, device=self.device))
        # On-rank seconds; the controller's timing_s/update_actor minus this is dispatch + transfer overhead.
        metrics["timing_s/update_actor_on_rank"] = time.perf_counter() - start
        metrics["perf/max_memory_allocated_gb"] = peak_memory_gib(self.device)
        return metrics

    # ------------------------------------------------------------------------------------------- split pools
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Training rank 0 becomes rank 0 of the group that carries weights to the rollout pool (the other training
        ranks only take part in the gathers). Returns once every rollout rank joined too."""
        if self.rank == 0:
            self.weight_group = standalone_group(host, port, 0, world_size, self.device)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def send_weights(self) -> dict[str, float]:
        """Split pools: streams the actor's current weights to every rollout rank (which call receive_weights at the
        same time); the sync's seconds and size, as rank 0 measured them."""
        start, streamed = time.perf_counter(), {}
        bucket_bytes = self.config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes * 2**20
        with phases.running(self.actor, "sync"):
            sent = send_weights(self.actor, self.weight_group, self.rank, bucket_bytes, stats=streamed)
        return {"async/weight_sync_s": time.perf_counter() - start, "async/weight_sync_gib": streamed["bytes"] / 2**30,
                "rollout/weights_synced": sent}

    # ------------------------------------------------------------------------------------------- checkpoint
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, hf_dir: str) -> None:
        """What actor.checkpoint.save_contents names: "model", "optimizer", "extra" (lr schedule, this rank's RNG
        and the rollout's sampling state) into `path`, and HF safetensors into `hf_dir` with "hf_model". `hf_dir`
        always gets the HF config and the tokenizer (as verl's)."""
        key = "actor_rollout_ref.actor.checkpoint.save_contents"
        contents = checkpoint.checked_contents(self.config.actor_rollout_ref.actor.checkpoint.save_contents, key)
        with phases.running(self.actor, "checkpoint"):
            self.actor.save(path, hf_dir=hf_dir if "hf_model" in contents else None, contents=contents & CHECKPOINT_STATE)
        if self.rank == 0:
            os.makedirs(hf_dir, exist_ok=True)
            head_model_config(self.actor.hf_config, self.actor.spec.kind).save_pretrained(hf_dir)
            self.tokenizer.save_pretrained(hf_dir)
            processor = vision_processor(self.config.actor_rollout_ref.model.path)  # a vision-language model's, beside it
            if processor is not None:
                processor.save_pretrained(hf_dir)
            checkpoint.write_contents(path, contents)
        if "extra" in contents:
            save_rng_state(path, self.rank, {"rollout": self.rollout.state_dict()} if self.rollout is not None else {})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """What actor.checkpoint.load_contents names, refused if `path` does not hold it; rank 0 says once what a
        resume leaves as built (model.path's weights, a fresh optimizer, the schedule at step 0)."""
        key = "actor_rollout_ref.actor.checkpoint.load_contents"
        wanted = checkpoint.checked_contents(self.config.actor_rollout_ref.actor.checkpoint.load_contents, key)
        contents, notes = checkpoint.restore_plan(path, wanted, key)
        if self.rank == 0:
            for note in notes:
                print(f"WARNING: {note} ({path})", flush=True)
        with phases.running(self.actor, "checkpoint"):
            self.actor.load(path, contents=contents)
        if "extra" in contents:
            state = load_rng_state(path, self.rank)
            if self.rollout is not None:
                self.rollout.load_state_dict(state["rollout"])
