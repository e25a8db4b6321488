"""The rollout worker of split pools (`actor_rollout_ref.hybrid_engine=False`): a rollout engine on devices of its
own, fed the trainer's weights over a group spanning both pools (rlcore.rollout.weight_sync.send_weights)."""

from __future__ import annotations

import os
import time

from rlcore.controller.decorator import Dispatch, register
from rlcore.models.hf import import_external_lib, named_load, policy_tokenizer
from rlcore.protocol import DataProto
from rlcore.rollout.weight_sync import receive_weights
from rlcore.utils.determinism import deterministic_kernels
from rlcore.utils.dist import standalone_group
from rlcore.workers import phases
from rlcore.workers.common import RoleWorker, load_rng_state, save_rng_state
from rlcore.workers.rollout_parts import build_rollout_parts, generate, sampling_params


class RolloutWorker(RoleWorker):
    """Generates; holds no training state. Its weights change only when the trainer sends them.

    Two calls may run at once (Ray runs them in threads of the actor): a sync's `receive_weights` beside the
    rollouter's `generate_sequences`, which the engine's WeightGate parks at a decode step (partial rollouts)."""

    max_concurrency = 2

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg = self.config.actor_rollout_ref
        if cfg.rollout.full_determinism:  # process-wide, before any kernel runs
            deterministic_kernels()
        import_external_lib(cfg.model.external_lib, "actor_rollout_ref.model.external_lib")  # registers a custom architecture
        key = "actor_rollout_ref.model.tokenizer_path" if cfg.model.tokenizer_path else "actor_rollout_ref.model.path"
        with named_load(key, cfg.model.tokenizer_path or cfg.model.path, "the tokenizer"):
            self.tokenizer = policy_tokenizer(cfg.model, cfg.model.trust_remote_code)
        self.rollout, self.agent_loop = build_rollout_parts(self.config, self.tokenizer, self.device, self.rank)
        self.weight_group = None

    def shutdown(self) -> None:
        if getattr(self, "agent_loop", None) is not None:
            self.agent_loop.close()
        super().shutdown()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Rollout rank r is rank r + 1 of the weight group (training rank 0 is its rank 0)."""
        self.weight_group = standalone_group(host, port, self.rank + 1, world_size, self.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int) -> None:
        """The trainer's weights after `version` steps, into this rank's engine (training rank 0 calls send_weights
        at the same time). A generation in flight parks meanwhile, or finishes first (rlcore.rollout.base.WeightGate)."""
        with self.rollout.gate.updating(version):
            self.rollout.wake_up(["weights"])
            self.rollout.update_weights(receive_weights(self.weight_group, self.rank + 1))
            self.rollout.wake_up(["kv_cache"])

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Samples with the weights of the last sync; the KV cache stays awake (nothing else shares the device)."""
        start = time.perf_counter()
        phases.reset_peak(self.device)
        out, timing = generate(self.rollout, self.agent_loop, prompts, sampling_params(self.config, self.tokenizer, prompts.meta_info))
        timing["timing_s/generate_on_rank"] = time.perf_counter() - start
        memory = phases.ledger("generate", {}, self.rollout, device=self.device)
        out.meta_info.update(timing=timing, memory=memory)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        save_rng_state(path, self.rank, {"rollout": self.rollout.state_dict()})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.rollout.load_state_dict(load_rng_state(path, self.rank)["rollout"])
