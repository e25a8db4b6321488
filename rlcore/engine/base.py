"""The seam between backend-neutral workers and a training backend (FSDP2, Megatron). Engines are built by
`rlcore.engine.factory.build_engine`; this module imports no implementation."""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rlcore.config.megatron_schema import MegatronConfig
from rlcore.engine.optim import lr_factor
from rlcore.models.experts import splits_experts
from rlcore.models.hf_export import SHARD_BYTES, head_model_config, save_safetensors_stream
from rlcore.models.lora import Adapters, LoraSpec
from rlcore.protocol import DataProto
from rlcore.rollout.base import WEIGHT_BUCKET_BYTES
from rlcore.utils.checkpoint import checkpoint_load
from rlcore.utils.checkpoint_contents import STATE

# An engine hands these functions per-token outputs for the response tokens of a micro-batch, `[batch, response_len]`
# float32 (the next-token shift is done): a causal LM gives "log_probs" (of the response tokens, at the request's
# temperature) and, when asked, "entropy"; a value model gives "values", a reward model "scores". Never logits: under tensor parallelism
# they exist only as vocabulary shards, and a 150k vocabulary must not be materialised for a whole micro-batch.
# loss_fn(outputs, micro_batch) -> (scalar loss to backprop, metrics of this micro-batch): 0-dim tensors (detached,
# left on the device until read once per mini-batch) or floats
LossFn = Callable[[dict[str, torch.Tensor], DataProto], tuple[torch.Tensor, dict[str, torch.Tensor | float]]]
# fn(outputs, micro_batch) -> dict of per-sample tensors [micro_batch, ...]
ForwardFn = Callable[[dict[str, torch.Tensor], DataProto], dict[str, torch.Tensor]]


# The training state an engine holds, each of which may live on the compute device or in host memory between phases.
STATE_KINDS = ("params", "grads", "optimizer")
SCHEDULE_FILE = "scheduler.pt"  # a checkpoint's "extra": the lr schedule's position (TrainEngine._save_schedule)
CHECKPOINT_STATE = frozenset(STATE)  # what save/load handle


@dataclass(frozen=True)
class TokenRequest:
    """What a causal-LM engine computes for each response token (value models ignore it)."""

    temperature: float = 1.0  # log-probs of the distribution the rollout sampled from
    entropy: bool = False     # also the entropy of that distribution (costs one more reduction per token)
    # A mixture of experts' routes (router replay): "record" adds `routed_experts` [batch, seq, layers, top_k] to the
    # outputs; "replay" forces the batch's `routed_experts` in every MoE layer (and records what the experts got);
    # "free" lets the routers route.
    routes: str = "free"
    # Also sum_v p(v)^2 per token (the optimal token baseline's score norm, actor.calculate_sum_pi_squared).
    sum_pi_squared: bool = False
    # On-policy distillation. topk > 0: also each position's k likeliest tokens, "topk_ids" and "topk_log_probs"
    # `[batch, response_len, k]` (no gradient; a teacher's scoring, the student's overlap metric). gather: the name
    # of a batch column `[batch, response_len, k]` of token ids whose log-probs, with gradient, come back as
    # "gathered_log_probs" (the student's at the teacher's top-k).
    topk: int = 0
    gather: str | None = None


@dataclass
class FSDPSpec:
    """What only the FSDP2 engine reads: sharding, its precision and offload policy, its kernels (the role's
    fsdp_config and FSDP-only keys). The Megatron engine's counterpart is the schema's MegatronConfig."""

    reduce_dtype: str = "float32"         # gradients are reduced across ranks in this (mixed_precision.reduce_dtype)
    offload_policy: bool = False          # torch's CPUOffloadPolicy: params live on CPU, streamed per block
    reshard_after_forward: bool = True
    fsdp_size: int = -1                   # ranks per shard group (HSDP: replicated across groups); -1 = all
    forward_prefetch: bool = False        # each unit issues the next one's all-gather before its own forward
    wrap_min_params: int = 0              # units: 0 = one per decoder block; N = FSDP1's size-based policy
    activation_offload: bool = False      # checkpointed block inputs kept in host memory (model.enable_activation_offload)
    use_torch_compile: bool = False       # the log-prob head's chunk kernels compiled (<role>.use_torch_compile)
    prefix_grouper: bool = False          # pack each distinct prompt once, its responses after it (actor.use_prefix_grouper)


@dataclass
class EngineSpec:
    """What a worker asks of an engine; built from the role's config section."""

    model_path: str
    kind: str = "causal_lm"               # causal_lm: log-probs; value: a scalar head read before each response
                                          # token (critic); reward: the same head read at each token (reward model)
    override_config: dict[str, Any] = field(default_factory=dict)
    hf_config_path: str | None = None     # read the HF config from here instead of model_path (model.hf_config_path)
    trust_remote_code: bool = False       # let modeling code shipped in the model directory run (model.trust_remote_code)
    param_dtype: str = "float32"          # compute dtype under mixed precision (fsdp_config.dtype)
    model_dtype: str = "float32"          # storage of frozen weights: a frozen role (reference) or a LoRA base; full
                                          # fine-tuning keeps fp32 masters whatever it says
    lora: LoraSpec | None = None          # train LoRA adapters only (model.lora_rank > 0)
    trainable: bool = True                # False for the reference policy: no optimizer, no grads
    freeze_vision_tower: bool = False     # a vision-language model's tower: no gradients, no optimizer state
    gradient_checkpointing: bool = False
    param_offload: bool = False           # move params off the device between phases (worker calls offload())
    grad_offload: bool = False            # move gradient buffers off the device between phases (Megatron)
    optimizer_offload: bool = False       # move optimizer state off the device between phases
    use_remove_padding: bool = False      # pack micro-batches (varlen attention) instead of computing on padding
    ulysses_sp: int = 1                   # Ulysses group size (FSDP2, packed only; 1 under Megatron): each rank a slice of the tokens
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    warmup_steps: int = 0
    total_steps: int = 1
    lr_scheduler_type: str = "constant"   # constant | cosine | linear | inverse_square_root
    optimizer_overrides: dict[str, Any] = field(default_factory=dict)  # optim.override_optimizer_config
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    zero_indexed_step: bool = False  # the first update is the schedule's step 0 (verl's optim.zero_indexed_step)
    warmup_init_ratio: float = 0.0  # warmup starts at this fraction of lr (verl's Megatron optim.lr_warmup_init / lr)
    grad_clip: float = 1.0
    fsdp: FSDPSpec | None = field(default_factory=FSDPSpec)  # strategy=fsdp2's own settings (None under Megatron)
    megatron: MegatronConfig | None = None  # strategy=megatron: the role's `megatron` section, typed: a key the
                                            # section leaves out takes the schema's default, the engine has none
    load_weights: bool = True             # False: the architecture only, parameters left uninitialised (the memory
                                          # rehearsal on fake tensors, rlcore.cli.rehearsal)


def read_metrics(per_micro: list[dict[str, torch.Tensor | float]]) -> list[dict[str, float]]:
    """The micro-batches' metrics as floats, read from the device in one transfer: loss functions leave them as
    0-dim tensors, so a mini-batch costs one host sync instead of one per metric per micro-batch."""
    keys = [(i, key) for i, metrics in enumerate(per_micro) for key in metrics]
    out: list[dict[str, float]] = [{} for _ in per_micro]
    if keys:
        device = next((v.device for m in per_micro for v in m.values() if torch.is_tensor(v)), torch.device("cpu"))
        scalars = [v.detach().reshape(()).float() if torch.is_tensor(v) else torch.tensor(float(v), device=device)
                   for v in (per_micro[i][key] for i, key in keys)]
        for (i, key), value in zip(keys, torch.stack(scalars).tolist()):
            out[i][key] = value
    return out


def is_fake(tensor: torch.Tensor) -> bool:
    """A tensor of the memory rehearsal (FakeTensorMode): a shape without values, so a step's data-dependent
    decisions (is the gradient norm finite?) take the path a real step takes."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


class TrainEngine(ABC):
    """A sharded model (+ optimizer) on this rank's process group.

    Data parallelism: ranks with the same `dp_rank` hold the same model replica's pieces (TP/PP peers) and must be
    given the same data; `is_output_rank` marks the one rank per replica whose outputs and metrics are the
    replica's (with pipeline parallelism only the last stage computes them). FSDP2: every rank is its own dp_rank.
    """

    dp_rank: int = 0
    dp_size: int = 1
    dp_group = None           # the data-parallel process group (None: the whole world)
    is_output_rank: bool = True
    spec: EngineSpec
    device: torch.device
    optimizer = None          # None for a frozen role
    optimizer_steps = 0       # the lr schedule's position: every optimizer_step() counts, taken or skipped
    hf_config: Any            # the model's HF config (what save_hf writes beside the weights)

    @abstractmethod
    def forward(self, micro_batches: list[DataProto], fn: ForwardFn, request: TokenRequest = TokenRequest()) -> list[dict[str, torch.Tensor]]:
        """No-grad forward of each micro-batch; returns fn's outputs per micro-batch (an empty list on a rank that
        is not an output rank)."""

    def moe_metrics(self) -> dict[str, float]:
        """A mixture of experts' router load since the last call (rlcore.models.router.Routing.metrics); {} when the
        model has no routers or the engine does not measure them."""
        return {}

    @abstractmethod
    def forward_backward(self, micro_batches: list[DataProto], loss_fn: LossFn, request: TokenRequest = TokenRequest()) -> list[dict[str, float]]:
        """Accumulates gradients of loss_fn over the micro-batches; returns each micro-batch's metrics (empty on a
        rank that is not an output rank). Every rank of a replica is given the same micro-batches."""

    def learning_rate(self) -> float:
        """The lr of the next optimizer step: the schedule (rlcore.engine.optim.lr_factor) at `optimizer_steps`."""
        s = self.spec
        return s.lr * lr_factor(self.optimizer_steps, s.warmup_steps, s.total_steps, s.lr_scheduler_type, s.min_lr_ratio, s.num_cycles,
                                s.zero_indexed_step, s.warmup_init_ratio)

    def optimizer_step(self, skip: bool = False) -> dict[str, float]:
        """Clips, steps (skipping non-finite gradients), advances the lr schedule; returns grad_norm, lr,
        skipped_step. `skip` (the same on every rank): a step with nothing to learn from (a mini-batch whose every
        token was rejected) drops any gradients and leaves weights and optimizer state alone, but still advances the
        lr schedule, which follows global steps; grad_norm 0."""
        lr = self.learning_rate()
        grad_norm, stepped = self._apply_gradients(lr, skip)
        self.optimizer_steps += 1
        return {"grad_norm": grad_norm, "lr": lr, "skipped_step": float(not stepped)}

    @abstractmethod
    def _apply_gradients(self, lr: float, skip: bool) -> tuple[float, bool]:
        """The backend's part of optimizer_step: sets `lr`, takes the gradient norm and clips, steps unless `skip`
        or a gradient is not finite (decided alike on every rank), drops the gradients; (grad norm, stepped)."""

    def save_hf(self, hf_dir: str, max_shard_bytes: int = SHARD_BYTES) -> None:
        """HF safetensors + config.json, written shard by shard from the weight stream as it is gathered (collective;
        rank 0 writes). The stream leaves a tied head out (safetensors refuses shared storage; HF re-ties it on load)
        and a MoE's experts go out under its checkpoints' names."""
        writing = dist.get_rank() == 0
        save_safetensors_stream(hf_dir, self.rollout_weights(), writing, max_shard_bytes, split_experts=splits_experts(self.hf_config.to_dict()))
        if writing:
            head_model_config(self.hf_config, self.spec.kind).save_pretrained(hf_dir)
        dist.barrier()

    def _save_schedule(self, path: str, contents: frozenset[str]) -> None:
        """"extra": the lr schedule's position, one file both engines write (rank 0)."""
        if "extra" in contents and self.optimizer is not None and dist.get_rank() == 0:
            torch.save({"optimizer_steps": self.optimizer_steps}, os.path.join(path, SCHEDULE_FILE))

    def _load_schedule(self, path: str, contents: frozenset[str]) -> None:
        if "extra" in contents and self.optimizer is not None:
            state = checkpoint_load(os.path.join(path, SCHEDULE_FILE))
            # FSDP2 checkpoints written before the engines shared this held torch's LambdaLR state: its last_epoch
            # counted the same optimizer steps
            self.optimizer_steps = state["optimizer_steps"] if "optimizer_steps" in state else state["last_epoch"]

    @abstractmethod
    def rollout_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES, transient: bool = False, adapted_only: bool = False,
                        unmerged: bool = False, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights under HF names, one tensor at a time, gathered in buckets of about
        `bucket_bytes` (one collective per bucket). Collective: every rank iterates. `transient=True`: the caller
        is done with each tensor before it draws the next (the weight sync copies it into the rollout), so the
        engine may hand out views of a buffer it reuses (FSDP2 on CPU: one shared-memory segment per host).
        With LoRA each adapted weight comes merged (W + scaling * B @ A); `adapted_only`: only those (the frozen
        rest has not changed since the last full stream); `unmerged`: the frozen base alone, adapters left out
        (they follow as `rollout_adapters()`). `trainable_only` (no LoRA): the parameters that take gradients, so
        a frozen vision tower, which the rollout already holds, is neither gathered nor sent."""

    def rollout_adapters(self) -> Adapters:
        """LoRA: the trained adapters, full, under HF module names (`model.lora.merge=False`'s sync). Collective."""
        raise NotImplementedError(f"{type(self).__name__} cannot send LoRA adapters unmerged; set actor_rollout_ref.model.lora.merge=True")

    def disabled_adapters(self) -> ContextManager:
        """Within it the model computes as its base (LoRA adapters off): the reference policy of a LoRA run."""
        if self.spec.lora is None:
            return contextlib.nullcontext()
        raise NotImplementedError(f"{type(self).__name__} does not train LoRA adapters")

    # Whether gradients stay allocated between updates (Megatron's grad buffer) or exist only while an update runs
    # (FSDP2 frees them at every optimizer step).
    persistent_grads: bool = True

    @property
    def resident(self) -> frozenset[str]:
        """Which of STATE_KINDS are on the compute device now: the engine's own account, which the memory ledger
        reads (on CPU, where device and host are one memory, it is the only account there is)."""
        return frozenset(self.__dict__.setdefault("_resident", set(STATE_KINDS)))

    def offload(self, params: bool = True, grads: bool = True, optimizer: bool = True) -> None:
        """Moves the chosen state to host memory; what is already there stays put."""
        kinds = _chosen(params, grads, optimizer) & self.resident
        if kinds:
            self._move_state(kinds, to_host=True)
            self.__dict__["_resident"] -= kinds

    def onload(self, params: bool = True, grads: bool = True, optimizer: bool = True) -> None:
        """Brings the chosen state back to the compute device; what is already there stays put."""
        kinds = _chosen(params, grads, optimizer) - self.resident
        if kinds:
            self._move_state(kinds, to_host=False)
            self.__dict__["_resident"] |= kinds

    @abstractmethod
    def _move_state(self, kinds: frozenset[str], to_host: bool) -> None:
        """Moves the state of `kinds` (a subset of STATE_KINDS) to the host or back to the device."""

    @abstractmethod
    def state_bytes(self) -> dict[str, int]:
        """Bytes each of STATE_KINDS takes on this rank when present (this rank's shards), wherever it is now.
        Gradients count as they are allocated during an update; optimizer state as it exists (AdamW allocates
        its moments at the first step)."""

    def save(self, path: str, hf_dir: str | None = None, contents: frozenset[str] = CHECKPOINT_STATE) -> None:
        """Into `path`, the states named in `contents`, in the one layout every engine writes: "model" (its sharded
        weights) and "optimizer" (its state) as one torch distributed checkpoint (DCP: `.metadata` and a file per
        rank, each engine's shards under its own keys: _checkpoint_state), "extra" the lr schedule's position
        (scheduler.pt), then what the engine adds (_saved: LoRA's adapter in peft's format, Megatron's layout); HF
        safetensors + config into `hf_dir` (rank 0)."""
        os.makedirs(path, exist_ok=True)
        state = self._checkpoint_state(contents, loading=False)
        if state:
            dcp.save(state, checkpoint_id=path)
        self._save_schedule(path, contents)
        self._saved(path, contents)
        if hf_dir is not None:
            self.save_hf(hf_dir)

    def load(self, path: str, contents: frozenset[str] = CHECKPOINT_STATE) -> None:
        """Restores the states named in `contents` from `path`; the others stay as built (a fresh optimizer, the
        schedule at step 0, model.path's weights). The engine first checks the checkpoint is one it can resume."""
        self._check_checkpoint(path)
        state = self._checkpoint_state(contents, loading=True)
        if state:
            dcp.load(state, checkpoint_id=path)
        self._restore(state, contents)
        self._load_schedule(path, contents)

    @abstractmethod
    def _checkpoint_state(self, contents: frozenset[str], loading: bool) -> dict:
        """{"model": ..., "optim": ...} as far as `contents` names them: what DCP writes, or (loading) the tensors it
        reads into, allocated as the saved ones were (an optimizer's moments included)."""

    @abstractmethod
    def _restore(self, state: dict, contents: frozenset[str]) -> None:
        """Applies the state DCP read into _checkpoint_state's tensors."""

    def _saved(self, path: str, contents: frozenset[str]) -> None:
        """What the engine writes beside the DCP state (nothing by default)."""

    def _check_checkpoint(self, path: str) -> None:
        """Refuses, naming why, a checkpoint this engine cannot resume (none by default)."""


def _chosen(params: bool, grads: bool, optimizer: bool) -> frozenset[str]:
    return frozenset(kind for kind, chosen in zip(STATE_KINDS, (params, grads, optimizer)) if chosen)
