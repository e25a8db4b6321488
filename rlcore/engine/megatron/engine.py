"""The Megatron TP/PP training engine on megatron-core: GPTModel chunks, its DDP and (distributed) optimizer, its
1F1B / interleaved schedules, and the HF weights both ways. Same TrainEngine contract as FSDP2."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from rlcore.config.megatron_schema import MEGATRON_UNSUPPORTED, MegatronConfig
from rlcore.engine.base import STATE_KINDS, WEIGHT_BUCKET_BYTES, EngineSpec, ForwardFn, LossFn, TokenRequest, TrainEngine, read_metrics
from rlcore.engine.megatron.attention import sum_latent_key_gradient_over_tp
from rlcore.engine.megatron.inputs import ModelInputs, model_inputs
from rlcore.engine.megatron.lora import apply_lora, disabled
from rlcore.engine.megatron.model import Layout, build_chunks, padded_vocab_size, transformer_config, without_transformer_engine
from rlcore.engine.megatron.offload import grad_buffers, move_state, state_bytes
from rlcore.engine.megatron.routes import RouteReplay, RouterLoad
from rlcore.engine.megatron.weights import export_hf, export_manifest, layer_map, load_hf
from rlcore.families import family_of
from rlcore.models.hf import load_config, to_torch_dtype
from rlcore.models.logits import TOKEN_CHANNELS, channel_names, stack_channels, token_log_probs
from rlcore.models.lora import Adapters
from rlcore.models.router import ROUTES
from rlcore.utils.dist import ReduceOp, all_reduce_values, collective_timeout_minutes

LAYOUT_FILE = "megatron_layout.json"  # beside a checkpoint: the layout it was written with (a resume needs the same)


def init_model_parallel(layout: Layout, seed: int, device: torch.device) -> None:
    """megatron-core's process groups for this layout (once per process; every engine of a process shares them,
    so the reference must use the actor's layout, as in verl)."""
    if mpu.model_parallel_is_initialized():
        have = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size(),
                mpu.get_virtual_pipeline_model_parallel_world_size(), mpu.get_expert_model_parallel_world_size(),
                mpu.get_expert_tensor_parallel_world_size())
        want = (layout.tp, layout.pp, layout.vpp, layout.ep, layout.etp)
        if have != want:
            raise ValueError(f"this process already runs megatron-core with TP, PP, VPP, EP, expert-TP = {have}; another engine asked "
                             f"for {want}. Roles sharing a process (actor and reference) need the same sizes")
        return
    if device.type == "cpu":
        from rlcore.engine.megatron.cpu_shim import apply_cpu_shim

        apply_cpu_shim()
    without_transformer_engine()
    sum_latent_key_gradient_over_tp()
    mpu.initialize_model_parallel(layout.tp, layout.pp, layout.vpp, expert_model_parallel_size=layout.ep,
                                  expert_tensor_parallel_size=layout.etp,
                                  distributed_timeout_minutes=collective_timeout_minutes())  # nccl_timeout, not its 30 min
    # TP ranks get different RNG streams for TP-split weights and dropout, DP replicas the same (megatron's rule).
    model_parallel_cuda_manual_seed(seed)


def ddp_settings(m: MegatronConfig) -> dict[str, Any]:
    """megatron-core's DistributedDataParallelConfig for the role's `megatron` section: rlcore's defaults, which
    override_ddp_config replaces key by key (verl's scripts set grad_reduce_in_fp32, overlap_grad_reduce, ...)."""
    return {"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, "overlap_param_gather": False,
            "use_distributed_optimizer": m.use_distributed_optimizer, **m.override_ddp_config}


def optimizer_config(settings: dict[str, Any], overrides: dict[str, Any]) -> OptimizerConfig:
    """megatron-core's OptimizerConfig from rlcore's optim keys, then `optim.override_optimizer_config` on top, as
    verl applies it (e.g. optimizer_cpu_offload=True, optimizer_offload_fraction=1: megatron-core's hybrid CPU/GPU
    Adam). A name OptimizerConfig lacks is refused here, where megatron-core is importable for sure."""
    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"optim.override_optimizer_config: {', '.join(unknown)} not field(s) of megatron-core's OptimizerConfig "
                         f"(megatron/core/optimizer/optimizer_config.py)")
    return OptimizerConfig(**{**settings, **overrides})


class MegatronEngine(TrainEngine):
    def __init__(self, spec: EngineSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        m = spec.megatron
        if m is None:
            raise ValueError("a Megatron engine needs its role's megatron section (EngineSpec.megatron; rlcore.engine.factory.engine_spec builds it)")
        for key, (ok, what) in MEGATRON_UNSUPPORTED.items():  # the validator's table, for callers that skip it
            if getattr(m, key) != ok:
                raise ValueError(f"megatron.{key}={getattr(m, key)} ({what}) is not supported by rlcore; use megatron.{key}={ok}")
        self.layout = Layout.from_config(m)
        init_model_parallel(self.layout, m.seed, device)
        torch.manual_seed(m.seed)  # the same on every rank: initialisation before the HF weights arrive
        self.hf_config = load_config(spec.model_path, spec.override_config, spec.trust_remote_code, spec.hf_config_path)
        self.vocab_size = self.hf_config.vocab_size
        self.padded_vocab = padded_vocab_size(self.vocab_size, self.layout.tp)
        self.tied = spec.kind == "causal_lm" and bool(getattr(self.hf_config, "tie_word_embeddings", False))
        dtype = to_torch_dtype(spec.param_dtype)
        self.config = transformer_config(self.hf_config, self.layout, dtype, device, spec.gradient_checkpointing and spec.trainable,
                                         m.override_transformer_config)
        self.modules = build_chunks(self.hf_config, self.config, spec.kind, device)
        self.hf_layer = layer_map(family_of(self.hf_config.to_dict()).megatron)  # transformer_config refused a family without one
        load_hf(self.modules, spec.model_path, self.config, self.vocab_size, self.padded_vocab, spec.kind, self.tied,
                getattr(self.hf_config, "initializer_range", 0.02), self.hf_layer)
        for chunk in self.modules:
            if chunk.post_process:
                chunk.output_layer.forward = self._head(chunk)
        if spec.lora is not None and spec.trainable:  # the base frozen, adapters on the dense linears (model.lora.*)
            if self.config.num_moe_experts:
                raise ValueError("model.lora with strategy=megatron on a mixture of experts is not supported yet: use FSDP2 "
                                 "(model.lora_rank) for a MoE model's LoRA")
            apply_lora(self.modules, spec.lora, m.seed)
        self.routes = RouteReplay(self.modules, self.config)  # MoE routers: record / replay routes on request
        self.router_load = RouterLoad(self.modules, self.config)  # MoE routers: the training forwards' load metrics
        self.optimizer = None
        self.model = self.modules
        if spec.trainable:
            self._build_optimizer(m)
        else:
            for chunk in self.modules:
                chunk.requires_grad_(False)
        self.dp_rank, self.dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        self.dp_group = mpu.get_data_parallel_group()
        self.is_output_rank = mpu.is_pipeline_last_stage() and mpu.get_tensor_model_parallel_rank() == 0
        self._manifest = None
        self._adapter_manifest = None  # LoRA's factors, exported unmerged (rollout_adapters)
        self._inputs: ModelInputs | None = None  # the micro-batch the running forward step is on
        self._request = TokenRequest()

    def _build_optimizer(self, m: dict[str, Any]) -> None:
        ddp_config = DistributedDataParallelConfig(**ddp_settings(m))
        self.model = [DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
                      for i, chunk in enumerate(self.modules)]
        # After the last micro-batch: DP gradient reduce(-scatter), tied-embedding gradients across stages.
        self.config.finalize_model_grads_func = finalize_model_grads
        betas = tuple(self.spec.betas)
        opt_config = optimizer_config(dict(
            optimizer="adam", lr=self.spec.lr, weight_decay=self.spec.weight_decay, adam_beta1=betas[0], adam_beta2=betas[1], adam_eps=1e-8,
            clip_grad=self.spec.grad_clip, bf16=self.config.bf16, fp16=self.config.fp16, params_dtype=self.config.params_dtype,
            use_distributed_optimizer=ddp_config.use_distributed_optimizer,
        ), self.spec.optimizer_overrides)
        # config_overrides={}: weight decay on every parameter, biases and norms included, as the FSDP2 engine's
        # AdamW does (megatron's default exempts them): switching backends does not change the optimisation.
        self.optimizer = get_megatron_optimizer(opt_config, self.model, config_overrides={})

    # ------------------------------------------------------------------------------------------- compute
    def _head(self, chunk):
        """The last stage's output layer, replaced: from the final hidden states `[s, b, h]` it keeps only the
        states before response tokens, then computes per-token log-probs (+ entropy) vocab-parallel over the TP
        group, or a critic's values. GPTModel returns the result transposed to `[b, k, channels]`."""
        layer = chunk.output_layer
        tp_group = mpu.get_tensor_model_parallel_group() if self.layout.tp > 1 else None
        vocab_start = mpu.get_tensor_model_parallel_rank() * (self.padded_vocab // self.layout.tp)

        value = self.spec.kind == "value"

        def forward(hidden: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
            inputs, request = self._inputs, self._request
            if self.layout.sp:
                # Each TP rank holds 1/tp of the sequence: gather it. Backward: the vocabulary shards' partial
                # gradients are summed by the reduce-scatter (a value head's are whole on every rank: split).
                hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=not value, group=tp_group)
            states = inputs.select(hidden)  # [k, b', h]
            w = weight if weight is not None else layer.weight
            if value:
                return states @ w.t(), None
            stats = token_log_probs(states.reshape(-1, states.shape[-1]), w, inputs.head_tokens.reshape(-1), request.temperature,
                                    request.entropy, vocab_start=vocab_start, vocab_size=self.vocab_size, group=tp_group,
                                    reduce_hidden_grad=not self.layout.sp, with_sum_pi_squared=request.sum_pi_squared)
            return stack_channels(stats, states.shape[:-1]), None

        return forward

    def _schedule(self, micro_batches: list, on_output, request: TokenRequest, forward_only: bool) -> list:
        """Runs megatron-core's schedule (no pipelining, 1F1B, or interleaved 1F1B) over the micro-batches.
        `on_output(outputs, mb)` -> (loss, result) on the last stage; returns the results in micro-batch order.

        Pipeline parallelism and token budgets: every micro-batch of this rank is one schedule micro-batch; they
        may differ in shape (trimmed width, or packed length) because stages exchange each activation's shape
        first (variable_seq_lengths). Ranks of a replica get the same micro-batches (same dp_rank)."""
        self._request = request
        micro_batches = self._fit_interleaving(micro_batches)
        num = len(micro_batches)
        channels = {"values": 0} if self.spec.kind == "value" else {name: TOKEN_CHANNELS.index(name) for name in channel_names(request)}

        chunk_of = {id(chunk): i for i, chunk in enumerate(self.model)}
        index_of = {id(mb): i for i, mb in enumerate(micro_batches)}
        self.routes.start(request.routes, forward_only)
        # Routes recorded over pipeline stages are whole only after the schedule: on_output runs then (forward-only).
        staged = request.routes == "record" and self.layout.pp > 1
        if staged and not forward_only:
            raise ValueError("recording routes over pipeline stages runs in forward-only passes (the old-log-prob pass)")

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            inputs = model_inputs(mb, self.spec.use_remove_padding, self.device, self.layout.tp if self.layout.sp else 1)
            self._inputs = inputs
            self.routes.before(request.routes, mb, inputs, chunk_of[id(model)])
            self.router_load.before(mb, inputs, count=not forward_only)
            output = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, attention_mask=None,
                           packed_seq_params=inputs.packed_seq_params)
            self.router_load.after_forward()  # a recomputation in backward routes again: not counted twice
            if staged:
                self.routes.keep_stage(index_of[id(mb)], mb, inputs, chunk_of[id(model)])

            def loss_func(output_tensor):
                per_token = inputs.unpack(output_tensor)
                outputs = {name: per_token[..., i].float() for name, i in channels.items()}
                if staged:
                    return output_tensor.sum() * 0, (outputs, mb)
                if request.routes == "record":
                    outputs[ROUTES] = self.routes.recorded(mb, inputs)
                loss, result = on_output(outputs, mb)
                # The schedule divides each micro-batch's loss by their number; rlcore's losses are already each
                # micro-batch's share of the mini-batch loss (rlcore.algos.agg), so undo it.
                return loss * num, result

            return output, loss_func

        iterators = [iter(micro_batches) for _ in self.model] if len(self.model) > 1 else iter(micro_batches)
        results = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iterators, model=self.model, num_microbatches=num,
            seq_length=max(mb.batch["input_ids"].shape[-1] for mb in micro_batches), micro_batch_size=1, forward_only=forward_only,
        )
        self._inputs = None
        self.routes.after()
        if staged:
            routes = self.routes.stage_routes(micro_batches)
            results = [on_output({**outputs, ROUTES: r}, mb)[1] for (outputs, mb), r in zip(results, routes)]
        return list(results) if mpu.is_pipeline_last_stage() else []

    def _fit_interleaving(self, micro_batches: list) -> list:
        """The interleaved schedule runs micro-batches in groups of N per virtual stage with pp <= N <= M and no
        last group shorter than pp. N = pp when M is a multiple of it, else one group of all M; with fewer
        micro-batches than stages, the largest are halved (exact: each one's loss is its share of the mini-batch
        loss, and halves stay consecutive, so outputs keep their order)."""
        if self.layout.vpp is None:
            return micro_batches
        pp = self.layout.pp
        parts = list(micro_batches)
        while len(parts) < pp:
            i = max(range(len(parts)), key=lambda j: len(parts[j]))
            if len(parts[i]) < 2:
                raise ValueError(f"interleaved pipeline (virtual_pipeline_model_parallel_size={self.layout.vpp}) needs at least "
                                 f"pipeline_model_parallel_size={pp} micro-batches per step, and this rank has {len(parts)} of one sample "
                                 "each: give each rank more samples, or drop virtual_pipeline_model_parallel_size")
            parts[i : i + 1] = parts[i].split((len(parts[i]) + 1) // 2)
        self.config.microbatch_group_size_per_vp_stage = pp if len(parts) % pp == 0 else len(parts)
        return parts

    def forward(self, micro_batches, fn: ForwardFn, request: TokenRequest = TokenRequest()) -> list[dict[str, torch.Tensor]]:
        for chunk in self.model:
            chunk.eval()
        zero = torch.zeros((), device=self.device)
        with torch.no_grad():
            results = self._schedule(micro_batches, lambda out, mb: (zero, {k: v.detach().cpu() for k, v in fn(out, mb).items()}), request, True)
        return results if self.is_output_rank else []

    def forward_backward(self, micro_batches, loss_fn: LossFn, request: TokenRequest = TokenRequest()) -> list[dict[str, float]]:
        for chunk in self.model:
            chunk.train()
        results = self._schedule(micro_batches, loss_fn, request, False)
        return read_metrics(results) if self.is_output_rank else []

    def moe_metrics(self) -> dict[str, float]:
        return self.router_load.metrics()

    def _apply_gradients(self, lr: float, skip: bool) -> tuple[float, bool]:
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            for group in opt.optimizer.param_groups:
                group["lr"] = lr
        # A non-finite gradient anywhere (fp overflow, a bad batch) must not poison the weights: every rank agrees
        # to skip the step. (megatron's own check raises instead; its clipping would pass NaN through.)
        # skip (see TrainEngine.optimizer_step): no check and no step, on every rank alike; the schedule still advances.
        bad = 0.0 if skip else float(not all(torch.isfinite(b.grad_data).all() for c in self.model for b in grad_buffers(c)))
        finite = not skip and not all_reduce_values([bad], op=ReduceOp.MAX)[0]
        grad_norm = 0.0 if skip else float("nan")
        if finite:
            _, grad_norm, _ = self.optimizer.step()  # megatron: grad norm over TP/PP/DP, clip, Adam, param all-gather
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        return float(grad_norm), finite

    # ------------------------------------------------------------------------------------------- weights
    def rollout_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES, transient: bool = False, adapted_only: bool = False,
                        unmerged: bool = False, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        # LoRA: every weight is sent, the adapted ones merged (adapted_only is FSDP's saving), or, `unmerged`, the base.
        # trainable_only is FSDP's saving too (Megatron builds no vision tower to freeze): every weight is sent.
        if self._manifest is None:
            self._manifest = export_manifest(self.modules, self.spec.kind, self.tied, self.hf_layer)
        if unmerged and self.spec.lora is not None:
            return self._base_weights(bucket_bytes)
        return export_hf(self.modules, self._manifest, self.config, self.vocab_size, self.device, bucket_bytes)

    def _base_weights(self, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        with disabled(self.modules):  # the export merges only enabled adapters
            yield from export_hf(self.modules, self._manifest, self.config, self.vocab_size, self.device, bucket_bytes)

    def rollout_adapters(self) -> Adapters:
        """The adapters gathered from their TP layout (and PP stages) into peft's names over HF modules."""
        if self.spec.lora is None:
            return super().rollout_adapters()
        if self._adapter_manifest is None:
            self._adapter_manifest = export_manifest(self.modules, self.spec.kind, self.tied, self.hf_layer, adapters=True)
        named = export_hf(self.modules, self._adapter_manifest, self.config, self.vocab_size, self.device, WEIGHT_BUCKET_BYTES)
        return Adapters({name: t.clone() for name, t in named}, self.spec.lora.rank, self.spec.lora.alpha)

    def disabled_adapters(self):
        return disabled(self.modules) if self.spec.lora is not None else super().disabled_adapters()

    def _move_state(self, kinds: frozenset[str], to_host: bool) -> None:
        move_state(self, to_host, "params" in kinds, "grads" in kinds, "optimizer" in kinds)

    def state_bytes(self) -> dict[str, int]:
        return {kind: state_bytes(self, kind) for kind in STATE_KINDS}

    # ------------------------------------------------------------------------------------------- checkpoint
    def _layout_meta(self) -> dict[str, int | None]:
        return {"tp": self.layout.tp, "pp": self.layout.pp, "vpp": self.layout.vpp, "dp": self.dp_size}

    def _inner_optimizers(self) -> list[torch.optim.Optimizer]:
        return [opt.optimizer for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]

    def _checkpoint_state(self, contents: frozenset[str], loading: bool) -> dict:
        """Plain tensors under keys of this rank's place in the layout: "model" the TP x PP piece (its data-parallel
        replicas hold the same keys, which DCP writes once), "optim" each inner optimizer's state (this rank's shard
        under the distributed optimizer), its param groups, and its fp32 main weights."""
        state = {}
        if "model" in contents:
            state["model"] = {f"{self._piece()}.{c}.{n}": p.detach() for c, chunk in enumerate(self.modules) for n, p in chunk.named_parameters()}
        if "optimizer" in contents and self.optimizer is not None:
            optim = {}
            for i, opt in enumerate(self._inner_optimizers()):
                if loading:
                    _materialise_state(opt)
                sd, shard = opt.state_dict(), self._shard(i)
                optim.update({f"{shard}.state.{index}.{name}": value for index, values in sd["state"].items() for name, value in values.items()})
                optim[f"{shard}.param_groups"] = sd["param_groups"]
                # Loading the optimizer alone leaves the main weights as built (model.path's): read into copies then
                mains = [p.detach() for g in opt.param_groups for p in g["params"]]
                optim.update({f"{shard}.main.{j}": m if not loading or "model" in contents else m.clone() for j, m in enumerate(mains)})
            state["optim"] = optim
        return state

    def _piece(self) -> str:
        """This rank's TP x PP piece of the model."""
        return f"tp{mpu.get_tensor_model_parallel_rank()}_pp{mpu.get_pipeline_model_parallel_rank()}"

    def _shard(self, i: int) -> str:
        """Inner optimizer `i`'s state on this rank (its data-parallel shard of the piece's)."""
        return f"{self._piece()}_dp{self.dp_rank}.{i}"

    @torch.no_grad()
    def _restore(self, state: dict, contents: frozenset[str]) -> None:
        """The model's tensors and the main weights were read in place; each optimizer takes its state back whole."""
        if "optim" in state:
            optim = state["optim"]
            for i, opt in enumerate(self._inner_optimizers()):
                shard = self._shard(i)
                opt.load_state_dict({"param_groups": optim[f"{shard}.param_groups"],
                                     "state": {index: {name: optim[f"{shard}.state.{index}.{name}"] for name in values}
                                               for index, values in opt.state_dict()["state"].items()}})
        if self.optimizer is not None and not {"model", "optimizer"} <= contents:
            # The main weights must be the model's: the checkpoint's without their optimizer, or model.path's under
            # a restored optimizer; else the next step would write back the weights they were built from.
            self.optimizer.reload_model_params()

    def _saved(self, path: str, contents: frozenset[str]) -> None:
        """The layout beside the state: a resume must use the same one (DCP holds plain tensors, not resharded)."""
        if dist.get_rank() == 0:
            with open(os.path.join(path, LAYOUT_FILE), "w") as f:
                json.dump(self._layout_meta(), f)
        dist.barrier()

    def _check_checkpoint(self, path: str) -> None:
        if not os.path.isfile(os.path.join(path, ".metadata")) and any(f.startswith("model_tp") for f in os.listdir(path)):
            raise ValueError(f"checkpoint {path} holds per-rank model_tp*/optim_tp* files, the layout rlcore's Megatron engine wrote "
                             "before both engines shared one (a torch distributed checkpoint): resume it with that rlcore, or start a "
                             "new run from its HF export (actor/huggingface) as actor_rollout_ref.model.path")
        with open(os.path.join(path, LAYOUT_FILE)) as f:
            saved = json.load(f)
        if saved != self._layout_meta():
            raise ValueError(f"checkpoint {path} was written with megatron layout {saved}, this run has {self._layout_meta()}: resume with "
                             "the same tensor/pipeline/virtual-pipeline/data-parallel sizes, or start a new run from its HF export "
                             "(actor/huggingface) as actor_rollout_ref.model.path")


def _materialise_state(opt: torch.optim.Optimizer) -> None:
    """A fresh optimizer's state as its first step would create it (moments, step), for a load to read into: one
    step at lr 0 and weight decay 0 over zero gradients, which moves no weight."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(p in opt.state for p in params):
        return
    kept = [(g["lr"], g.get("weight_decay", 0.0)) for g in opt.param_groups]
    grads = [p.grad for p in params]
    for g in opt.param_groups:
        g["lr"], g["weight_decay"] = 0.0, 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, grad in zip(params, grads):
        p.grad = grad
    for g, (lr, decay) in zip(opt.param_groups, kept):
        g["lr"], g["weight_decay"] = lr, decay
