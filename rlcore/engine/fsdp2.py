"""FSDP2 (`fully_shard`) training engine: one short function applies parallelism, the rest is the TrainEngine."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from typing import Iterator

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlcore.engine.activation_offload import offload_checkpointed_inputs
from rlcore.engine.base import WEIGHT_BUCKET_BYTES, EngineSpec, ForwardFn, LossFn, TokenRequest, TrainEngine, is_fake, read_metrics
from rlcore.engine.fsdp_units import chain_forward_prefetch, fsdp_mesh, fsdp_units
from rlcore.engine.gather import Exchange, gather_full_tensors
from rlcore.engine.host_buffers import HostBuffers
from rlcore.engine.optim import adamw_kernel, lr_factor
from rlcore.engine.sharded_load import load_shards, materialize, parameters_on_meta, renamed_checkpoint, safetensors_files, value_head_init
from rlcore.engine.shm_exchange import SharedMemoryExchange
from rlcore.families import family_of
from rlcore.models import lora
from rlcore.models.hf import TokenHead, decoder_layers, load_causal_lm, load_value_model, resolve_model_path, tied_weight_names, to_torch_dtype
from rlcore.models.logits import unstack_channels
from rlcore.models.prefix_grouper import pack_prefix_groups
from rlcore.models.recurrent import prepare_packing
from rlcore.models.router import ROUTES, Routing, aux_loss, routers, to_routes
from rlcore.models.ulysses import Ulysses, attach_ulysses, check_heads
from rlcore.models.varlen import attention_implementation, pack_sequences, unpack_responses
from rlcore.models.vision import (
    MULTI_MODAL_INPUTS,
    TowerAnchor,
    is_vision_config,
    packed_positions,
    rope_positions,
    rows_inputs,
    slice_image_features,
    vision_tower,
)
from rlcore.protocol import DataProto

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def apply_fsdp2(model: torch.nn.Module, blocks: torch.nn.ModuleList, mesh, spec: EngineSpec,
                tower: torch.nn.Module | None = None) -> None:
    """Activation checkpointing, then `fully_shard` on every unit (decoder blocks, unless the spec's size-based
    policy picks others) and finally the root (fixed order). A vision-language model's `tower`: its blocks, then the
    tower, first (the order its forward runs them, before the language model's)."""
    if spec.gradient_checkpointing and spec.trainable:
        # Non-reentrant checkpointing composes with FSDP2's pre/post-forward hooks. (transformers 5 renamed
        # gradient_checkpointing_enable to activation_checkpointing_enable.)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if spec.fsdp.activation_offload:
            offload_checkpointed_inputs(blocks)
    mp = MixedPrecisionPolicy(param_dtype=to_torch_dtype(spec.param_dtype), reduce_dtype=to_torch_dtype(spec.fsdp.reduce_dtype))
    kwargs = dict(mesh=mesh, mp_policy=mp, reshard_after_forward=spec.fsdp.reshard_after_forward)
    if spec.fsdp.offload_policy:
        # pin_memory needs an accelerator; on CPU-only torch it raises.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    units = fsdp_units(model, blocks, spec.fsdp.wrap_min_params)
    if tower is not None:
        units = [*getattr(tower, "blocks", ()), tower, *units]
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    if spec.fsdp.forward_prefetch:
        chain_forward_prefetch(units)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class FSDP2Engine(TrainEngine):
    def __init__(self, spec: EngineSpec, device: torch.device) -> None:
        if spec.fsdp is None:
            raise ValueError("the FSDP2 engine needs the spec's FSDP settings (spec.fsdp); a spec built for strategy=megatron has none")
        self.spec = spec
        self.device = device
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank, sp = (dist.get_rank() if dist.is_initialized() else 0), spec.ulysses_sp
        if world % sp:
            raise ValueError(f"ulysses_sequence_parallel_size={sp} does not divide the {world} ranks of the role")
        # Ranks d*sp .. d*sp+sp-1 form sequence-parallel group d: they hold data-parallel replica d's samples, each a
        # slice of the tokens. FSDP still shards the parameters over every rank.
        self.dp_rank, self.dp_size, self.is_output_rank = rank // sp, world // sp, rank % sp == 0
        self.ulysses: Ulysses | None = None
        with unset_fake_temporarily():  # the mesh is rank bookkeeping on real tensors, also in a rehearsal's fake mode
            self.mesh = fsdp_mesh(device.type, world, spec.fsdp.fsdp_size)
            if sp > 1:
                groups = init_device_mesh(device.type, (world // sp, sp), mesh_dim_names=("dp", "sp"))
                self.dp_group, self.ulysses = groups.get_group("dp"), Ulysses(groups.get_group("sp"))
        self._exchange: Exchange | None = None  # how transient weight streams travel (shared memory on one host)
        load = load_causal_lm if spec.kind == "causal_lm" else load_value_model  # value / reward: a scalar head
        # The prefix grouper packs too (its groups ride on the packed attention), whatever use_remove_padding says
        self.grouped = spec.fsdp.prefix_grouper and spec.kind == "causal_lm"
        attn = attention_implementation(spec.use_remove_padding or self.grouped)
        # Full fine-tuning keeps fp32 masters; frozen weights (a reference, a LoRA base) are stored in model_dtype
        # (bf16: half the memory, as verl's reference).
        dtype = to_torch_dtype(spec.model_dtype) if spec.lora or not spec.trainable else torch.float32
        # A model in safetensors is built on the meta device and each rank reads only its shard's rows after
        # sharding: no rank holds the whole model. A value model over a causal LM's checkpoint draws its scalar head
        # (one row) whole on every rank; so does LoRA its adapters (r rows each; B starts at zero), and its base is
        # read under the checkpoint's names. An adapter read from disk (lora_adapter_path) or a LoRA value model
        # (a trained copy of its head) loads whole and is sharded after.
        on_meta = not spec.lora or (spec.kind == "causal_lm" and not spec.lora.adapter_path)
        files = safetensors_files(resolve_model_path(spec.model_path)) if on_meta and spec.load_weights else None
        on_meta = on_meta and (files is not None or not spec.load_weights)
        initial, rename = {}, (lambda name: name)
        if on_meta:
            with parameters_on_meta():
                self.model = load(spec.model_path, spec.override_config, dtype=dtype, weights=False, attn_implementation=attn,
                                  trust_remote_code=spec.trust_remote_code, hf_config_path=spec.hf_config_path)
            if files is not None and spec.kind != "causal_lm":
                initial = value_head_init(self.model, files)
                on_meta = initial is not None  # None: the checkpoint names its tensors otherwise: load whole
            if on_meta and files is not None and renamed_checkpoint(self.model, files, initial):
                # transformers renames this family's checkpoint tensors on load (the generic path: Mixtral's experts,
                # say); rlcore's shard reader does not know them, so every rank loads the whole model, then shards it
                warnings.warn(f"{spec.model_path}: the checkpoint names its tensors as transformers converts them on load; every "
                              "rank loads the whole model through transformers, then shards it")
                on_meta = False
        if not on_meta:
            self.model = load(spec.model_path, spec.override_config, dtype=dtype, attn_implementation=attn,
                              trust_remote_code=spec.trust_remote_code, hf_config_path=spec.hf_config_path)
        self.hf_config = self.model.config
        blocks = decoder_layers(self.model)
        family = family_of(self.hf_config.to_dict())
        if spec.use_remove_padding or self.grouped:
            self._prepare_packing(blocks, family)
        if spec.lora:  # before sharding: fully_shard then sees the adapters as parameters of their blocks
            self.model = lora.apply_lora(self.model, spec.lora, value_head=spec.kind != "causal_lm")
            self._scalings = lora.scalings(self.model)
            if on_meta:
                initial, rename = lora.initial_adapters(self.model), lora.hf_name
        self.head = TokenHead(self.model, compiled=spec.fsdp.use_torch_compile) if spec.kind == "causal_lm" else None
        # A mixture of experts: hooks on its routers (router replay, load metrics, HF's load-balancing loss when its
        # config asks for it with output_router_logits).
        self.routing = Routing(self.model) if routers(self.model) else None
        if self.grouped and (self.routing is not None or self.ulysses is not None):
            # routes are kept per row token and Ulysses splits rows by sequence; grouped rows share their prompt's tokens
            raise ValueError("actor_rollout_ref.actor.use_prefix_grouper=True with a mixture of experts or Ulysses sequence "
                             "parallelism is not supported: set use_prefix_grouper=False")
        self.vision = is_vision_config(self.hf_config)
        if self.vision and self.grouped:
            raise ValueError(f"{self.hf_config.model_type}: a vision-language model with use_prefix_grouper is not supported yet "
                             "(a group's shared prompt would carry one row's images); use use_prefix_grouper=False")
        if self.vision and spec.freeze_vision_tower:
            vision_tower(self.model).requires_grad_(False)  # before the optimizer: no grads, no AdamW state for it
        if self.ulysses is not None and family is not None and family.recurrent:
            raise ValueError(f"ulysses_sequence_parallel_size={sp} with {self.hf_config.model_type}: its recurrent layers need every "
                             "token of a sequence on one rank; use ulysses_sequence_parallel_size=1")
        if self.ulysses is not None:
            reason = check_heads(self.hf_config.get_text_config().num_attention_heads, sp)
            if reason:
                raise ValueError(f"ulysses_sequence_parallel_size={sp}: {reason}; use a size that divides the heads")
            attach_ulysses(blocks, self.ulysses)
        apply_fsdp2(self.model, blocks, self.mesh, spec, vision_tower(self.model) if self.vision else None)
        if self.vision:
            self._anchor = TowerAnchor(self.model, device)
        if on_meta:
            materialize(self.model, torch.device("cpu") if spec.fsdp.offload_policy else device)
            if files is not None:
                load_shards(self.model, files, initial, rename)
        if spec.fsdp.offload_policy:
            # FSDP2 keeps the sharded parameters (and so their gradients and AdamW state) in host memory and streams
            # each block to the device for its compute: moving the model here would undo that. Buffers (rotary
            # frequencies) are small and computed with on the device.
            for module in self.model.modules():
                for name, buffer in module.named_buffers(recurse=False):
                    module._buffers[name] = buffer.to(device)
            self.__dict__["_resident"] = set()
        else:
            self.model.to(device)
        if self.head is not None and family is None and not is_fake(torch.empty(0, device=device)):
            # the generic path: whether the forward scales the head's output is read off one forward (a family module
            # states its head: plain or soft-capped); a rehearsal has no values to read
            self.head.calibrate(self.model, device)
        self.optimizer = None
        if spec.trainable:
            self.trained = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters only
            kernel = adamw_kernel(self.trained[0].device.type if self.trained else device.type, spec.optimizer_overrides)
            self.optimizer = torch.optim.AdamW(self.trained, lr=spec.lr, betas=tuple(spec.betas), weight_decay=spec.weight_decay,
                                               **kernel, **spec.optimizer_overrides)  # optim.override_optimizer_config
            lr_factor(0, spec.warmup_steps, spec.total_steps, spec.lr_scheduler_type, spec.min_lr_ratio, spec.num_cycles)  # a bad kind fails now
        else:
            self.model.requires_grad_(False)

    def _prepare_packing(self, blocks: torch.nn.ModuleList, family) -> None:
        """Readies the blocks for packed rows (recurrent layers restart per sequence); a model whose blocks cannot be
        packed runs padded batches instead, said once here (the prefix grouper has no padded form: refused)."""
        reason = prepare_packing(blocks, family.recurrent if family is not None else None)
        if reason is None:
            return
        if self.grouped:
            raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper=True packs prompts and responses, and {reason}; "
                             "set use_prefix_grouper=False")
        warnings.warn(f"use_remove_padding=True for {self.hf_config.model_type}: {reason}; this engine runs padded batches")
        self.spec = dataclasses.replace(self.spec, use_remove_padding=False)

    # ------------------------------------------------------------------------------------------- compute
    def _routing(self, mb: DataProto, request: TokenRequest, train: bool):
        """The routers' part of one forward (a no-op context for a dense model): routes to replay and the tokens that
        count, in the order the model sees them (every padded column, or the packed valid tokens)."""
        if self.routing is None:
            if request.routes != "free":
                raise ValueError(f"router replay ({request.routes}) on a model without MoE routers: set actor_rollout_ref.actor.router_replay.mode=disabled")
            return contextlib.nullcontext()
        mask = mb.batch["attention_mask"].to(self.device).bool()
        # Packed rows hold valid tokens only (under Ulysses, each rank's slice: its tail padding counts, a few tokens).
        valid = None if self.spec.use_remove_padding else mask.reshape(-1)
        replay = None
        if request.routes == "replay":
            routes = mb.batch[ROUTES].to(self.device)
            replay = routes[mask] if self.spec.use_remove_padding else routes.reshape(-1, *routes.shape[2:])
            if self.ulysses is not None:  # this rank's slice of the packed tokens; the padding takes experts 0..k-1
                replay = self.ulysses.local_tokens(replay, torch.arange(replay.shape[-1], device=self.device, dtype=replay.dtype))
        aux = train and bool(getattr(self.hf_config, "output_router_logits", False))
        # A replaying forward records too: what the experts received, for the caller that checks it.
        return self.routing.run(replay=replay, valid=valid, record=request.routes != "free", aux=aux, count=train)

    def _route_outputs(self, p, mb: DataProto, outputs: dict[str, torch.Tensor]) -> None:
        """Recorded routes `[batch, seq, layers, top_k]` and the load-balancing loss (x HF's router_aux_loss_coef)
        into `outputs`."""
        if p is None:
            return
        if p.record:
            mask = mb.batch["attention_mask"].bool()
            recorded = to_routes(p.recorded, self.routing.num_layers)
            if self.ulysses is not None:  # each rank routed its slice of the packed tokens
                recorded = self.ulysses.all_tokens(recorded, int(mask.sum()))
            recorded = recorded.cpu()
            if self.spec.use_remove_padding:
                routes = recorded.new_zeros(*mask.shape, *recorded.shape[1:])
                routes[mask] = recorded
            else:
                routes = recorded.view(*mask.shape, *recorded.shape[1:])
            outputs[ROUTES] = routes
        if p.aux_losses:
            outputs["router_aux_loss"] = self.hf_config.router_aux_loss_coef * aux_loss(p.aux_losses, self.routing.num_experts)

    def moe_metrics(self) -> dict[str, float]:
        return {} if self.routing is None else self.routing.metrics()

    def _outputs(self, mb: DataProto, request: TokenRequest) -> dict[str, torch.Tensor]:
        """Per-token outputs for the response tokens: `[batch, response_len]` log-probs (+ entropy, + the top token's
        log-prob) or values.

        Padded: the whole `[batch, seq]` rows, and only the response_len states before the response tokens reach
        the head. Packed (use_remove_padding): valid tokens only, and only the states that predict a response
        token reach the head. A causal LM's head projects those states onto the vocabulary chunk by chunk
        (rlcore.models.logits.token_log_probs): no `[tokens, vocab]` logits for the micro-batch."""
        inputs = {k: mb.batch[k].to(self.device) for k in MODEL_INPUTS}
        responses = mb.batch["responses"].to(self.device)
        response_len = responses.shape[1]
        if request.gather:  # the log-probs of these ids too: `[batch, response_len, 1 + k]`, the sampled token first
            responses = torch.cat([responses[..., None], mb.batch[request.gather].to(self.device)], -1)
        packing = self.spec.use_remove_padding or self.grouped
        vision = {}
        if self.vision:  # the rows' images, and multimodal RoPE positions from the tokens (rlcore.models.vision)
            vision = rows_inputs(mb.non_tensor_batch.get(MULTI_MODAL_INPUTS, ()), self.device)
            if not vision and bool((inputs["input_ids"] == self.hf_config.image_token_id).any()):
                # HF would embed the placeholders as plain tokens, with no error: wrong log-probs, silently
                raise ValueError(f"a micro-batch holds image tokens but no {MULTI_MODAL_INPUTS} (the processor's pixel_values "
                                 "and image_grid_thw per row): the caller dropped the batch's images")
            rope = rope_positions(self.model, inputs["input_ids"], inputs["attention_mask"], vision.get("image_grid_thw"))
            self._anchor.arm(not vision)
        if packing:
            pack = (lambda *a: pack_prefix_groups(*a)[0]) if self.grouped else pack_sequences
            packed = pack(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"], response_len)
            index, tokens = packed.response_index, responses[packed.response_valid][None]
        else:
            width = inputs["input_ids"].shape[-1]
            kwargs = dict(**inputs, use_cache=False)
            if self.vision:
                kwargs["position_ids"] = rope
            index, tokens = torch.arange(width - response_len - 1, width - 1, device=self.device), responses
        if self.spec.kind == "reward":  # a reward model's score is read AT each token, not before it
            index = index + 1
        shard = None
        if self.ulysses is not None:  # this rank's slice of the packed row, and the outputs its states give
            row_ids = packed.input_ids[0]
            packed, shard = self.ulysses.shard(packed, index)
            index, tokens = shard.local_index, self.ulysses.mine(shard, tokens)
            if vision:  # the images' features of this slice's image tokens (rlcore.models.vision.slice_image_features)
                vision = slice_image_features(self.model, vision, row_ids, shard.start, shard.length)
        if packing:
            positions = packed_positions(rope, inputs["position_ids"], inputs["attention_mask"]) if self.vision else packed.position_ids
            if self.vision and shard is not None:
                positions = self.ulysses.local_positions(positions)
            kwargs = dict(input_ids=packed.input_ids, position_ids=positions, use_cache=False, **packed.attention_kwargs)
        kwargs.update(vision)
        if self.routing is not None:  # the routing hooks compute the load-balancing loss, on the tokens that count
            kwargs["output_router_logits"] = False
        if self.head is None:  # a scalar per position, cheap to compute everywhere
            out = self.model(**kwargs).logits[:, index]
        else:
            with self.head.computing(tokens, request):
                out = self.model(**kwargs, logits_to_keep=index).logits
        if shard is not None:
            out = self.ulysses.gather(shard, out[0])[None]
        if packing:
            out = unpack_responses(out[0], packed.response_valid)
        if self.head is None:
            return {"scores" if self.spec.kind == "reward" else "values": out[..., 0].float()}
        return unstack_channels(out, request)

    def forward(self, micro_batches: list[DataProto], fn: ForwardFn, request: TokenRequest = TokenRequest()) -> list[dict[str, torch.Tensor]]:
        self.model.eval()
        results = []
        with torch.no_grad():
            for mb in micro_batches:
                with self._routing(mb, request, train=False) as p:
                    outputs = self._outputs(mb, request)
                    self._route_outputs(p, mb, outputs)
                results.append({k: v.detach().cpu() for k, v in fn(outputs, mb).items()})
        return results

    def forward_backward(self, micro_batches: list[DataProto], loss_fn: LossFn, request: TokenRequest = TokenRequest()) -> list[dict[str, float]]:
        self.model.train()
        metrics = []
        for mb in micro_batches:
            with self._routing(mb, request, train=True) as p:  # open through backward: a recompute replays the same routes
                outputs = self._outputs(mb, request)
                self._route_outputs(p, mb, outputs)
                loss, mb_metrics = loss_fn(outputs, mb)
                loss.backward()
            metrics.append(mb_metrics)
        return read_metrics(metrics)

    def _apply_gradients(self, lr: float, skip: bool) -> tuple[float, bool]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # skip: no norm to take (its collective is skipped on every rank alike) and no optimizer.step(): AdamW would
        # still move the weights on a zero gradient (momentum, weight decay).
        grad_norm = torch.tensor(0.0) if skip else _full(torch.nn.utils.clip_grad_norm_(self.trained, self.spec.grad_clip))
        # The norm clipping computed is the non-finite check too: one host read, no pass over the gradients.
        norm = float("nan") if is_fake(grad_norm) else float(grad_norm)
        finite = not skip and (is_fake(grad_norm) or math.isfinite(norm))
        if finite:
            self.optimizer.step()
        # A non-finite norm (fp overflow, a bad batch) must not poison the weights: drop this step's gradients.
        self.optimizer.zero_grad(set_to_none=True)
        return norm, finite

    # ------------------------------------------------------------------------------------------- weights
    def rollout_weights(self, bucket_bytes: int = WEIGHT_BUCKET_BYTES, transient: bool = False, adapted_only: bool = False,
                        unmerged: bool = False, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        # state_dict() of an FSDP2 module holds sharded DTensors, gathered a bucket at a time: peak extra memory
        # is one bucket of unsharded parameters, not a second copy of the model.
        exchange = None
        if transient and self.device.type == "cpu":
            if self._exchange is None:  # collective, once: are all ranks on this host (and more than one)?
                self._exchange = SharedMemoryExchange.for_group(dist.group.WORLD) or Exchange()
            exchange = self._exchange
        # A tied head is the embedding: sent once (under the embedding's name), as HF checkpoints store it.
        tied = tied_weight_names(self.model)
        named = [(n, t) for n, t in self.model.state_dict().items() if n not in tied]
        if self.spec.lora is None:
            if trainable_only:  # filtered before gathering (the same names on every rank): no collective for the frozen
                frozen = {n for n, p in self.model.named_parameters() if not p.requires_grad}
                named = [(n, t) for n, t in named if n not in frozen]
            return gather_full_tensors(named, bucket_bytes, self.device, exchange)
        if unmerged:  # the adapters are left out before gathering
            named = [(n, t) for n, t in named if not lora.is_factor(n)]
            return lora.base_weights(gather_full_tensors(named, bucket_bytes, self.device, exchange))
        # Filtered before gathering (the same names on every rank), so unchanged tensors cost no collective.
        named = [(n, t) for n, t in named if lora.is_adapted(n) or not adapted_only]
        return lora.merged_weights(gather_full_tensors(named, bucket_bytes, self.device, exchange), self._scalings, transient)

    def rollout_adapters(self) -> lora.Adapters:
        named = [(n, t) for n, t in self.model.state_dict().items() if lora.is_factor(n)]
        return lora.adapters_of(gather_full_tensors(named, WEIGHT_BUCKET_BYTES, self.device), self._scalings, self.spec.lora.rank)

    def disabled_adapters(self):
        return self.model.disable_adapter() if self.spec.lora else super().disabled_adapters()

    def _move_optimizer_state(self, device: torch.device) -> None:
        """AdamW's moments to the host (into buffers kept per tensor, pinned on CUDA) or back to the device."""
        host = self.__dict__.setdefault("_host_buffers", HostBuffers(self.device))
        for index, state in enumerate(self.optimizer.state.values()):
            for key, value in state.items():
                # 0-dim entries (AdamW's step count) stay where the optimizer keeps them.
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != device:
                    state[key] = host.to_host((index, key), value) if device.type == "cpu" else host.to_device((index, key), value, device)
        host.sync()

    # Gradients exist only between a backward and the optimizer step (zero_grad(set_to_none=True)); there is no
    # buffer to move between phases.
    persistent_grads = False

    def _move_state(self, kinds: frozenset[str], to_host: bool) -> None:
        # Under CPUOffloadPolicy FSDP2 owns parameter placement (they already live on CPU); only move them here
        # when that policy is off.
        device = torch.device("cpu") if to_host else self.device
        if "params" in kinds and not self.spec.fsdp.offload_policy:
            self.model.to(device)
        if "optimizer" in kinds and self.optimizer is not None:
            self._move_optimizer_state(device)
        if to_host and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def state_bytes(self) -> dict[str, int]:
        def local_bytes(t: torch.Tensor) -> int:
            t = t.to_local() if isinstance(t, DTensor) else t
            return t.numel() * t.element_size()

        params = list(self.model.parameters())
        optimizer = 0 if self.optimizer is None else sum(local_bytes(v) for state in self.optimizer.state.values()
                                                         for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return {"params": sum(local_bytes(p) for p in params),
                "grads": sum(local_bytes(p) for p in params if p.requires_grad) if self.spec.trainable else 0,
                "optimizer": optimizer}

    # ------------------------------------------------------------------------------------------- checkpoint
    def _state_options(self) -> StateDictOptions:
        # A LoRA checkpoint holds the adapters and their optimizer state; the frozen base is model.path's.
        return StateDictOptions(ignore_frozen_params=self.spec.lora is not None, strict=self.spec.lora is None)

    def _checkpoint_state(self, contents: frozenset[str], loading: bool) -> dict:
        """Sharded DTensors (a load reshards them to this run's ranks)."""
        state = {}
        if "model" in contents:
            state["model"] = get_model_state_dict(self.model, options=self._state_options())
        if "optimizer" in contents and self.optimizer is not None:
            # (materialises a fresh AdamW's moments, so that a load has tensors to fill)
            state["optim"] = get_optimizer_state_dict(self.model, self.optimizer, options=self._state_options())
        return state

    def _saved(self, path: str, contents: frozenset[str]) -> None:
        if "model" in contents and self.spec.lora is not None:
            self.save_adapter(os.path.join(path, "lora_adapter"))

    def save_adapter(self, out_dir: str) -> None:
        """The adapters in peft's format (collective; rank 0 writes)."""
        trained = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        full = list(gather_full_tensors(((n, p.detach()) for n, p in trained), WEIGHT_BUCKET_BYTES, self.device))
        if dist.get_rank() == 0:
            lora.save_adapter(self.model, lora.adapter_state(self.model, full), out_dir, self.spec.model_path)

    def _restore(self, state: dict, contents: frozenset[str]) -> None:
        if "model" in state:
            set_model_state_dict(self.model, state["model"], options=self._state_options())
        if "optim" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state["optim"], options=self._state_options())