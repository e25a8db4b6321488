"""The embedded rollout engine: continuous batching over a preallocated KV pool, on any device."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable

import torch

from rlcore.config.rollout_schema import RolloutConfig as _SCHEMA  # the engine's defaults are the config's
from rlcore.families.vision import placeholder_token_ids
from rlcore.models.hf import load_causal_lm, to_torch_dtype
from rlcore.models.lora import Adapters
from rlcore.models.router import ROUTE_DTYPE, Routing, to_routes
from rlcore.models.vision import is_vision_config
from rlcore.protocol import position_ids_from_mask
from rlcore.rollout.adapters import HeldAdapters
from rlcore.rollout.base import Carried, RolloutEngine, RolloutOutput, SamplingParams, Until
from rlcore.rollout.fused import FusedDecoder, fusable
from rlcore.rollout.graphs import DecodeGraphs, default_capture_sizes
from rlcore.rollout.kv_pool import ATTENTION_NAME, KVGeometry, KVPool, SlotCache, cache_keyword, decode_mask, prefill_mask
from rlcore.rollout.native_batch import Requests, RunningBatch, Scheduler
from rlcore.rollout.native_vision import ImageRows
from rlcore.rollout.sizing import native_kv_slots


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Masks (to -inf) tokens outside the top-k and outside the smallest set with cumulative prob >= top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token if the mass BEFORE it already reaches top_p; the most likely token always stays.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def group_size(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """n when the rows come in runs of n identical prompts (the trainer repeats each prompt rollout.n times,
    interleaved), else 1."""
    batch = input_ids.shape[0]
    same = ((input_ids == input_ids[:1]) & (attention_mask == attention_mask[:1])).all(-1)
    n = int(same.int().cumprod(0).sum())  # length of the first run
    if n <= 1 or batch % n:
        return 1
    grouped_ids, grouped_mask = input_ids.view(batch // n, n, -1), attention_mask.view(batch // n, n, -1)
    identical = (grouped_ids == grouped_ids[:, :1]).all() and (grouped_mask == grouped_mask[:, :1]).all()
    return n if bool(identical) else 1


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Picks the next token per row; returns (tokens [batch], log-probs [batch]) under the processed distribution."""
    logits = logits.float()
    if sampling.greedy:
        tokens = logits.argmax(-1)
        return tokens, torch.gather(logits.log_softmax(-1), -1, tokens[:, None]).squeeze(-1)
    logits = filter_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    log_probs = logits.log_softmax(-1)
    # torch.multinomial's own one-sample path (argmax of p / Exponential(1) noise: the same tokens for the same
    # generator state), minus its validity check, which reads a device value back to the host every step.
    noise = torch.empty_like(log_probs).exponential_(1, generator=generator)
    tokens = (log_probs.exp() / noise).argmax(-1)
    return tokens, torch.gather(log_probs, -1, tokens[:, None]).squeeze(-1)


@dataclass
class KeptKV:
    """One row's KV kept between calls (multi-turn): its real ids and each layer's `[kv_heads, len, head_dim]` K/V;
    with routes recorded, the routes that computed that KV `[len, layers, top_k]`."""

    tokens: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: torch.Tensor | None = None


class NativeRollout(RolloutEngine):
    """Holds its own (unsharded) copy of the policy, refreshed by `update_weights` before each rollout.

    Generation is continuous batching over a request queue: prompt groups wait until the KV pool has slots for
    all their samples (at most `max_num_seqs` sequences decode at once, and a prefill admits at most
    `max_num_batched_tokens` prompt tokens), finished sequences leave at once and free their slots for the next
    group. The pool is sized from `kv_cache_memory_bytes` when given, else on CUDA from `gpu_memory_utilization`
    x device memory less what the process already holds, else (CPU) only by `max_num_seqs`.
    Multi-turn rollouts keep each row's KV between calls (`keep_kv`, `prefix_of`): a turn prefills only what the
    last one appended.

    On CUDA, unless `enforce_eager`, a fusable model's decode step runs as CUDA graphs captured per bucketed batch
    size (`cudagraph_capture_sizes`, default 1, 2, 4, 8, 16, ... max_num_seqs; rollout/graphs.py).

    Partial rollouts (split pools): when another thread loads new weights (`gate.updating`), the running sequences
    park after their current decode step, then their KV (prompt and tokens so far) is recomputed under the new
    weights and decoding goes on, each row within its own token budget; its log-probs are those of the weights that
    sampled each token, and `versions` records the weights each row started and ended under."""

    keeps_kv_across_calls = True
    resumes_generation = True

    def __init__(self, model_path: str | None, pad_token_id: int, device: torch.device, dtype: str = "float32", override_config: dict | None = None,
                 seed: int = 0, model: torch.nn.Module | None = None, max_num_seqs: int = _SCHEMA.max_num_seqs,
                 max_num_batched_tokens: int = _SCHEMA.max_num_batched_tokens,
                 gpu_memory_utilization: float = _SCHEMA.gpu_memory_utilization, kv_cache_memory_bytes: int | None = None, max_model_len: int | None = None,
                 enforce_eager: bool = _SCHEMA.enforce_eager, cudagraph_capture_sizes: list[int] | None = None, record_routes: bool = False,
                 hf_config_path: str | None = None, trust_remote_code: bool = False, merge_adapters: bool = False) -> None:
        """Builds its own copy of the architecture at `model_path`, or decodes with `model` as given (no copy).
        `record_routes`: a mixture of experts' routes for every prompt and sampled token (R3 router replay), in
        RolloutOutput.routed_experts. `merge_adapters` (LoRA without merging: `rollout.engine_kwargs.native`): merge
        the adapters the syncs send into this copy's weights rather than apply them in every forward."""
        self.device = device
        self.pad_token_id = pad_token_id
        self.decoder: FusedDecoder | None = None
        self._owns_model = model is None
        if model is None:
            model = load_causal_lm(model_path, override_config, dtype=to_torch_dtype(dtype), weights=False,
                                   trust_remote_code=trust_remote_code, hf_config_path=hf_config_path).to(device)
            model.requires_grad_(False)
            # A MoE's load-balancing loss (a training config's output_router_logits) has no place in generation.
            if getattr(model.config, "output_router_logits", False):
                model.config.output_router_logits = False
            # Its own copy: the projections can be re-laid out for decoding (a model passed in keeps its layout).
            self.decoder = FusedDecoder(model) if fusable(model) else None
        self.model = model
        # A vision-language model's image / video placeholders are never sampled (as vLLM's logit bias and the
        # training head: rlcore.families.vision.placeholder_token_ids); its images arrive per call (ImageRows).
        self.vision = is_vision_config(model.config)
        self.suppressed = list(placeholder_token_ids(model.config))
        self._images: ImageRows | None = None
        self.adapters: HeldAdapters | None = None  # LoRA without merging: applied over this base (load_adapters)
        self.merge_adapters = merge_adapters
        self.routing = Routing(model) if record_routes else None
        self._routes: torch.Tensor | None = None  # [batch, prompt_len + max_tokens + 1 spare, layers, top_k] during a call
        self.cache_keyword = cache_keyword(model)  # "cache" or "past_key_values", by transformers release
        # Every name of every parameter: a tied head answers to `lm_head.weight` as well as to the embedding's name,
        # so a stream that carries it (or leaves it out, as rlcore's engines do) loads either way.
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self._params.update(dict(self.model.named_buffers()))
        # sleep(level=2) frees the parameters' storages in place (fused views share theirs) and wake_up(["weights"])
        # re-allocates them, so every view and the fused GEMMs follow; `_unfilled` names what no sync has refilled yet.
        self._storages = list({p.untyped_storage().data_ptr(): p for p in self.model.parameters()}.values()) if self._owns_model else []
        self._storage_bytes = [p.untyped_storage().nbytes() for p in self._storages]
        self._unfilled: dict[int, str] = {}  # id(parameter) -> its first name, while the weights await a sync
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.gpu_memory_utilization, self.kv_cache_memory_bytes = gpu_memory_utilization, kv_cache_memory_bytes
        self.max_model_len = max_model_len  # prompt + response tokens: what wake_up sizes the pool for
        # Decode steps between checks for finished rows: each check is a host sync, free on CPU (where a finished
        # row's extra steps are not), a stall of the launch queue on CUDA.
        self.finish_check_every = 1 if device.type == "cpu" else 4
        dtype_ = next(self.model.parameters()).dtype
        self.pool = KVPool(KVGeometry.of(self.model, dtype_), device)
        self.stats: dict[str, int] = {}  # the last generate(): kv_slots, prefills, peak_running (graph_captures, graph_capture_s on CUDA)
        self.kept: list[KeptKV | None] | None = None  # per row of the last generate(keep_kv=True)
        self.kept_under: int | None = None  # the weights version the kept KV was computed with
        # Graphs need the fused decoder (the HF-module path builds masks and caches in Python each step) and CUDA.
        self.graphs: DecodeGraphs | None = None
        if self.decoder is not None and device.type == "cuda" and not enforce_eager:
            sizes = cudagraph_capture_sizes or default_capture_sizes(max_num_seqs)
            self.graphs = DecodeGraphs(self.decoder, self.pool, self.model.config.get_text_config().vocab_size, sizes, capture=True)

    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._weights_freed():
            raise RuntimeError("update_weights() while the native rollout's weights sleep (sleep(level=2)): call wake_up(['weights']) "
                               "first (rlcore.rollout.weight_sync.sync_weights does)")
        if self.adapters is not None:
            self.adapters.forget_base()  # a sync of the base overwrites any merged adapter
        for name, tensor in weights:
            if name not in self._params:
                raise KeyError(f"rollout model has no weight {name!r}; the training and rollout architectures differ")
            self._params[name].copy_(tensor.to(self.device))
            self._unfilled.pop(id(self._params[name]), None)

    @torch.no_grad()
    def load_adapters(self, adapters: Adapters) -> None:
        if self.adapters is None:
            if not self._owns_model:
                raise ValueError("native rollout over a model passed in (no copy of its own): it applies no LoRA adapters")
            self.adapters = HeldAdapters(self.model, self.device, next(self.model.parameters()).dtype, self.merge_adapters)
            if self.decoder is not None:
                self.decoder.adapters = self.adapters
        self.adapters.load(adapters)
        if self.graphs is not None:  # captured over the previous factors' stacked copies: captured again at the next decode
            self.graphs.release()

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams, keep_kv: bool = False,
                 prefix_of: list[int] | None = None, multi_modal_data: list | None = None,
                 multi_modal_inputs: list[dict | None] | None = None, until: Until | None = None,
                 carried: Carried | None = None) -> RolloutOutput:
        """`keep_kv`: keep each row's KV (prompt and response but the last token) after the call, for the next one.
        `prefix_of[r]`: row r continues row `prefix_of[r]` of the previous call (its ids start with that row's ids
        and sampled tokens): its kept KV is copied in and only the rest is prefilled (multi-turn: the last sampled
        token and the appended tool response). A row whose ids do not continue the kept ones is prefilled whole.
        `multi_modal_inputs`: a vision-language model's rows' processor tensors (pixel_values, image_grid_thw; None
        for a row without images), whose prompts hold the images' expanded tokens; `multi_modal_data` (the images
        themselves, for vLLM) is not needed here.
        `until`: end the call once that many whole groups finished, the other rows part-way (RolloutOutput.finished);
        `carried`: rows an earlier call left part-way, going on from their tokens (their KV rebuilt under the current
        weights), rows it finished passed through."""
        if (until is not None or carried is not None) and (keep_kv or prefix_of is not None or multi_modal_inputs is not None
                                                           or self.routing is not None):
            raise ValueError("native rollout: until / carried (partial rollouts across calls) with multi-turn KV, images or "
                             "recorded routes is not supported; trainer.v1.trainer_mode=colocate_async needs single-turn text rollouts")
        if self._weights_freed():
            raise RuntimeError("native rollout: generate() while sleep(level=2) has freed the weights: wake_up(['weights']) and sync "
                               "them first (rlcore.rollout.weight_sync.sync_weights)")
        if self._unfilled:
            names = sorted(self._unfilled.values())
            raise RuntimeError(f"native rollout: generate() after sleep(level=2) freed the weights, and the sync since filled all but "
                               f"{len(names)} of them ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): sync every weight "
                               f"after wake_up(['weights']), or sleep(level=1) to keep them (LoRA's adapted-only syncs)")
        if self.adapters is not None and self.adapters.use(sampling.adapter) and self.graphs is not None:
            self.graphs.release()  # another adapter's tensors: captured again
        elif self.adapters is None and sampling.adapter is not None:
            raise KeyError(f"native rollout: SamplingParams.adapter={sampling.adapter!r}, but no LoRA adapter is loaded")
        images = ImageRows(self.model, list(multi_modal_inputs), self.device) if multi_modal_inputs is not None and any(multi_modal_inputs) else None
        if images is not None and (keep_kv or prefix_of is not None):
            raise ValueError("native rollout: multi-turn calls (keep_kv / prefix_of) with images are not supported (a later turn "
                             "would prefill without them); train this vision-language model with single-turn rollouts")
        # Only the language model reads the pool (setting a composite config's attention sets its vision tower's too)
        config = self.model.config.get_text_config() if self.vision else self.model.config
        was_training, attention, self._images = self.model.training, config._attn_implementation, images
        self.model.eval()
        if self.decoder is None:  # HF modules read the pool through the registered attention function
            config._attn_implementation = ATTENTION_NAME
        try:
            with self.gate.generating():
                return self._generate(input_ids, attention_mask, sampling, keep_kv, prefix_of, until, carried)
        finally:
            # A model passed in (SFT, benchmarks) goes back to training with its own attention.
            self.model.train(was_training)
            config._attn_implementation = attention
            self._images = None

    def kv_budget_bytes(self) -> float | None:
        if self.kv_cache_memory_bytes is not None:
            return float(self.kv_cache_memory_bytes)
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            return self.gpu_memory_utilization * total - (torch.cuda.memory_allocated(self.device) - self.pool.nbytes)
        return None

    def _num_slots(self, batch: int, n: int, max_len: int) -> int:
        budget_bytes = self.kv_budget_bytes()
        slots = native_kv_slots(batch, self.max_num_seqs, budget_bytes, self.pool.geometry.bytes_per_token * max_len)
        if slots < n:
            budget = "" if budget_bytes is None else f" and a KV budget of {budget_bytes / 2**30:.3f} GiB"
            raise ValueError(
                f"the native rollout can hold {slots} sequence(s) of {max_len} tokens (max_num_seqs={self.max_num_seqs}{budget}), "
                f"fewer than the {n} samples of one prompt; raise actor_rollout_ref.rollout.max_num_seqs, or the KV budget "
                f"(actor_rollout_ref.rollout.engine_kwargs.native.kv_cache_memory_bytes, or gpu_memory_utilization on CUDA)")
        return slots

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams, keep_kv: bool,
                  prefix_of: list[int] | None, until: Until | None = None, carried: Carried | None = None) -> RolloutOutput:
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        (batch, prompt_len), max_tokens = input_ids.shape, sampling.max_tokens
        stop_ids = torch.tensor(sampling.stop_token_ids or [-1], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed) if sampling.seed is not None else self.generator
        # Prefix sharing: the n samples of a prompt arrive as n identical rows; each prompt is prefilled once and its
        # KV copied to its samples' slots.
        n = group_size(input_ids, attention_mask) if prefix_of is None else 1
        # KV kept under other weights (a sync between two turns) is stale: those rows are prefilled whole.
        previous = self.kept if self.kept_under == self.gate.version else None
        self.kept, self.kept_under = [None] * batch if keep_kv else None, self.gate.version
        reuse = [previous[r] if previous and r is not None and r < len(previous) else None for r in prefix_of] if prefix_of else None
        pool = self.pool
        if not (pool.keys and pool.max_len >= prompt_len + max_tokens and pool.num_slots >= n):  # else: the pool wake_up made
            pool.acquire(self._num_slots(batch, n, prompt_len + max_tokens), prompt_len + max_tokens)
        requests = Requests.of(input_ids, attention_mask, n, max_tokens, self.pad_token_id, self.gate.version, reuse, carried)
        if self.routing is not None:  # column prompt_len + max_tokens is the spare, as the responses'
            self._routes = torch.zeros(batch, prompt_len + max_tokens + 1, self.routing.num_layers, self.routing.top_k, dtype=ROUTE_DTYPE)
        scheduler = Scheduler(batch, n, prompt_len, self.max_num_batched_tokens, requests.finished if carried is not None else None)
        running = RunningBatch.empty(self.model.config.get_text_config().vocab_size, self.device)
        self.stats = {"kv_slots": pool.num_slots, "prefills": 0, "peak_running": 0, "prefill_tokens": 0, "reused_tokens": 0,
                      "resumed_rows": 0, "rebuilt_tokens": 0}
        num_steps = 0
        captures_before = (self.graphs.num_captures, self.graphs.capture_seconds) if self.graphs is not None else None
        while scheduler or len(running):
            admitted = scheduler.admit(len(running), pool.num_slots)
            if admitted:
                self._join(requests, running, admitted)
            token, log_prob = sample_next(running.logits, sampling, generator)
            requests.record(running.req, running.sampled(token, stop_ids, max_tokens), token, log_prob)
            num_steps += 1
            # Asking whether a row finished reads a device value on the host; on CUDA only every few steps, so the
            # host can queue steps ahead (finished rows decode a few more tokens into the spare column meanwhile).
            if num_steps % self.finish_check_every == 0:
                self._retire(requests, running)
                if until is not None and until.met(requests.finished, n):
                    break  # the running rows stop here, their last sampled token not yet fed (a resume feeds it)
            self._step(requests, running)
            if self.gate.park():  # new weights were loaded meanwhile: the running rows go on under them
                self._resume(requests, running, keep_kv)
        if self.graphs is not None:
            self.stats["graph_captures"] = self.graphs.num_captures - captures_before[0]
            self.stats["graph_capture_s"] = round(self.graphs.capture_seconds - captures_before[1], 4)
        routes, self._routes = self._routes, None
        return requests.output(routes)

    def _join(self, requests: Requests, running: RunningBatch, admitted: list[int]) -> None:
        """Prefills the admitted groups into the slots after the running ones; their samples run from the next step.
        Groups carried part-way from an earlier call get their KV rebuilt instead (_join_carried)."""
        if requests.carried is not None:
            resumed = [first for first in admitted if requests.resumed(first)]
            if resumed:
                self._join_carried(requests, running, resumed)
            admitted = [first for first in admitted if first not in resumed]
            if not admitted:
                return
        n = requests.n
        logits, pos = self._prefill(requests.input_ids[admitted], requests.attention_mask[admitted], len(running), n,
                                    [requests.reuse[r] for r in admitted] if requests.reuse else None, admitted)
        rows = (torch.tensor(admitted, device=self.device)[:, None] + torch.arange(n, device=self.device)).flatten()
        if requests.versions is not None:
            requests.versions[rows] = self.gate.version
        running.add(rows, pos, logits, requests.prompt_len)
        self.stats["prefills"] += 1
        self.stats["peak_running"] = max(self.stats["peak_running"], len(running))

    def _join_carried(self, requests: Requests, running: RunningBatch, groups: list[int]) -> None:
        """The unfinished rows of carried groups into the slots after the running ones: each slot holds its prompt
        (left-padded to the prompts' width) and the tokens it had, their KV computed under the current weights."""
        rows = torch.tensor([first + j for first in groups for j in range(requests.n)], device=self.device)
        rows = rows[~requests.finished[rows]]
        if not len(rows):
            return
        rows = rows[torch.argsort(requests.carried[rows], stable=True)]  # equal lengths side by side: one forward each
        steps, first = requests.carried[rows], len(running)
        self.pool.start[first : first + len(rows)] = requests.prompt_len - requests.attention_mask[rows].sum(-1)
        pos = requests.prompt_len + steps
        logits = self._rebuild(rows, steps, pos, requests.input_ids, requests.attention_mask, requests.responses, base=first)
        running.add(rows, pos, logits, int(pos.max()), steps=steps)
        self.stats["peak_running"] = max(self.stats["peak_running"], len(running))

    def _retire(self, requests: Requests, running: RunningBatch) -> None:
        """The finished rows leave (their KV kept first, for a next turn): the last running slots fill their holes."""
        any_done, running.max_pos = torch.stack([running.done.any().long(), running.pos.max()]).tolist()  # one read-back for both
        if any_done:
            requests.finished[running.req[running.done]] = True
            if self.kept is not None:
                self._keep(running.done, running.req, running.steps, requests.input_ids, requests.attention_mask, requests.responses)
            running.select(self._compact(running.done, running.max_pos))

    def _step(self, requests: Requests, running: RunningBatch) -> None:
        """One decode step of every running slot: the sampled tokens in, the next-token logits out."""
        route_at = None
        if self._routes is not None:  # each fed token's routes go to the column it was sampled into (a finished row's: the spare)
            spare = requests.prompt_len + requests.max_tokens
            route_at = (running.req, torch.where(running.done, spare, requests.prompt_len + running.steps - 1)[:, None])
        running.logits = self._decode(running.token, running.pos, running.max_pos + 1, route_at, running.req) if len(running) else running.logits[:0]
        running.advance(self.pool.max_len)

    def _resume(self, requests: Requests, running: RunningBatch, keep_kv: bool) -> None:
        """After new weights were loaded mid-call: the finished rows leave, the running ones' KV is recomputed under
        the new weights (_rebuild), and what was kept for a next turn is dropped (the old weights' KV)."""
        done = running.done
        running.select(self._compact(done, running.max_pos) if bool(done.any()) else torch.arange(len(running), device=self.device))
        running.max_pos = int(running.pos.max()) if len(running) else 0
        running.logits = self._rebuild(running.req, running.steps, running.pos, requests.input_ids, requests.attention_mask, requests.responses)
        if requests.versions is not None:
            requests.versions[running.req, 1] = self.gate.version
        requests.reuse = None
        self.kept, self.kept_under = [None] * len(requests.input_ids) if keep_kv else None, self.gate.version

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, first: int, n: int, reuse: list | None = None,
                 rows: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes each prompt's KV once into slot `first + g*n`, copies it to the group's other n-1 slots.
        Returns the next-token logits per sample `[groups*n, vocab]` and every sample's next write position.
        `reuse` (n == 1): each row's KV kept from the previous call, or None. `rows`: the request row of each
        prompt (the first of its group), where recorded routes go."""
        lead = int((mask.sum(0) > 0).int().argmax())  # left padding common to all admitted prompts is dropped
        ids, mask = ids[:, lead:], mask[:, lead:]
        groups, length = ids.shape
        start = length - mask.sum(-1)
        pool = self.pool
        pool.start[first : first + groups * n : n] = start
        # Rows end together at `length`: with kept KV restored, only the last `window` positions are computed.
        window = self._restore(reuse, ids, start, first) if reuse and all(e is not None for e in reuse) else length
        if self._routes is not None and window < length:  # restored KV brings its routes (the forward below overwrites
            for row, s, e in zip(rows, start.tolist(), reuse):  # any kept position it recomputes)
                self._routes[row, lead + s : lead + s + len(e.routes)] = e.routes
        real = (length - start).clamp(max=window)
        self.stats["prefill_tokens"] += int(real.sum())
        cache = SlotCache(pool, first, groups, positions=length - window, kv_len=length, stride=n)
        route_at, positions, vision = None, position_ids_from_mask(mask), {}
        if self._images is not None:  # no kept KV with images: window == length
            positions, vision = self._images.prefill(ids, mask, rows, n)
        if self._routes is not None:  # the prompt column of each computed position (the common left padding was dropped)
            width, rows = mask.shape[1] + lead, torch.tensor(rows)
            route_at = (rows, torch.arange(width - window, width)[None].expand(groups, window))
        logits = self._forward(ids[:, length - window:], positions[..., length - window:],
                               prefill_mask(start, length)[:, :, length - window:], cache, route_at, vision)
        if self._routes is not None:  # a group's samples share its prompt's routes
            for j in range(1, n):
                self._routes[rows + j, :width] = self._routes[rows, :width]
        shared = slice(first, first + groups * n, n)
        for j in range(1, n):
            pool.copy_slots(shared, slice(first + j, first + groups * n, n), length)
        return logits.repeat_interleave(n, dim=0), torch.full((groups * n,), length, dtype=torch.long, device=self.device)

    def _rebuild(self, req: torch.Tensor, steps: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 responses: torch.Tensor, base: int = 0) -> torch.Tensor:
        """After new weights were loaded mid-call: recomputes the KV of slots `base ...` in place (each its prompt and
        the tokens sampled so far, at the positions they hold) and returns the next-token logits `[rows, vocab]`.
        Runs of neighbouring slots that end at the same position (rows admitted together) are one forward each."""
        if self._images is not None:
            raise ValueError("native rollout: new weights mid-call (partial rollouts on split pools) with images: the rebuilt KV "
                             "would need each row's images again; use actor_rollout_ref.rollout.name=vllm, or the hybrid engine")
        ends, starts, rows, sampled = pos.tolist(), self.pool.start[base : base + len(req)].tolist(), req.tolist(), steps.tolist()
        logits, first = [], 0
        while first < len(rows):
            last = first
            while last + 1 < len(rows) and ends[last + 1] == ends[first]:
                last += 1
            length, count = ends[first], last - first + 1
            ids = torch.full((count, length), self.pad_token_id, dtype=torch.long, device=self.device)
            for k, slot in enumerate(range(first, last + 1)):
                row = rows[slot]
                ids[k, starts[slot]:] = torch.cat([input_ids[row][attention_mask[row].bool()], responses[row, : sampled[slot]]])
            start = self.pool.start[base + first : base + last + 1]
            position_ids = (torch.arange(length, device=self.device) - start[:, None]).clamp_(min=0)
            cache = SlotCache(self.pool, base + first, count, positions=0, kv_len=length)
            logits.append(self._forward(ids, position_ids, prefill_mask(start, length), cache,
                                        self._rebuilt_route_columns(rows[first : last + 1], starts[first : last + 1], length, attention_mask)))
            self.stats["rebuilt_tokens"] += sum(ends[s] - starts[s] for s in range(first, last + 1))
            first = last + 1
        self.stats["resumed_rows"] += len(rows)
        return torch.cat(logits) if logits else torch.zeros(0, self.model.config.get_text_config().vocab_size, device=self.device)

    def _rebuilt_route_columns(self, rows: list[int], starts: list[int], length: int,
                               attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where a rebuild's recomputed positions put their routes (`_forward`'s route_at): a row's prompt and tokens
        so far overwrite the routes they had under the old weights, which the KV the rest of the row attends to no
        longer holds; a slot's left padding writes to the spare column."""
        if self._routes is None:
            return None
        prompt_width, spare = attention_mask.shape[1], self._routes.shape[1] - 1
        cols = torch.full((len(rows), length), spare, dtype=torch.long)
        for k, (row, start) in enumerate(zip(rows, starts)):
            first = prompt_width - int(attention_mask[row].sum())
            cols[k, start:] = torch.arange(first, first + length - start)
        return torch.tensor(rows), cols

    def _keep(self, done: torch.Tensor, req: torch.Tensor, steps: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              responses: torch.Tensor) -> None:
        """Copies the KV of the rows finishing now out of their slots (before others move in): the prompt and every
        sampled token but the last, which was never fed back. These copies live outside the pool's budget (on a GPU,
        one more copy of the rollout's KV between turns) until the next generate() or sleep()."""
        pool = self.pool
        for slot in done.nonzero().squeeze(-1).tolist():
            row, num_sampled = int(req[slot]), int(steps[slot])
            tokens = torch.cat([input_ids[row][attention_mask[row].bool()], responses[row, : num_sampled - 1]])
            begin = int(pool.start[slot])
            span = slice(begin, begin + len(tokens))
            routes = None
            if self._routes is not None:  # the row's first real token sits at column prompt_width - its prompt length
                first = attention_mask.shape[1] - int(attention_mask[row].sum())
                routes = self._routes[row, first : first + len(tokens)].clone()
            self.kept[row] = KeptKV(tokens, [k[slot, :, span].clone() for k in pool.keys], [v[slot, :, span].clone() for v in pool.values],
                                    routes)

    def _restore(self, reuse: list, ids: torch.Tensor, start: torch.Tensor, first: int) -> int:
        """Copies each row's kept KV into its slot `first + r` at its own start; returns how many trailing positions
        still need computing (the longest unkept suffix), or the whole width if a row does not continue its kept ids."""
        length, starts = ids.shape[1], start.tolist()
        window = max(length - s - len(e.tokens) for s, e in zip(starts, reuse))
        if window < 1 or any(not torch.equal(ids[r, s : s + len(e.tokens)], e.tokens) for r, (s, e) in enumerate(zip(starts, reuse))):
            return length
        for r, (s, e) in enumerate(zip(starts, reuse)):
            for cache, kept in zip((*self.pool.keys, *self.pool.values), (*e.keys, *e.values)):
                cache[first + r, :, s : s + len(e.tokens)] = kept
            self.stats["reused_tokens"] += min(len(e.tokens), length - window - s)
        return window

    def _compact(self, done: torch.Tensor, length: int) -> torch.Tensor:
        """Moves the running slots past the survivors' count into the holes of finished ones; returns, for each new
        slot, the old slot it came from."""
        survivors = (~done).nonzero().squeeze(-1)
        holes = done[: len(survivors)].nonzero().squeeze(-1)
        movers = survivors[survivors >= len(survivors)]
        if len(holes):
            self.pool.copy_slots(movers, holes, length)
        order = torch.arange(len(survivors), device=self.device)
        order[holes] = movers
        return order

    def _decode(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int, route_at: tuple | None = None,
                req: torch.Tensor | None = None) -> torch.Tensor:
        """One token per running slot `[0, rows)` (of request rows `req`), written at `pos`, reading key positions
        `[0, kv_len)` (kv_len > pos.max()); returns the next-token logits."""
        if self.graphs is not None:
            logits = self.graphs.decode(token, pos, kv_len, lambda: self._eager_decode(token, pos, kv_len))
            if logits is not None:
                return logits
        return self._eager_decode(token, pos, kv_len, route_at, req)

    def _eager_decode(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int, route_at: tuple | None = None,
                      req: torch.Tensor | None = None) -> torch.Tensor:
        rows = len(token)
        start = self.pool.start[:rows]
        cache = SlotCache(self.pool, 0, rows, positions=pos, kv_len=kv_len)
        positions = (pos - start)[:, None]
        if self._images is not None:
            positions = self._images.decode_positions(positions, req)
        return self._forward(token[:, None], positions, decode_mask(start, pos, kv_len), cache, route_at)

    def _forward(self, ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: SlotCache,
                 route_at: tuple[torch.Tensor, torch.Tensor] | None = None, vision: dict | None = None) -> torch.Tensor:
        """Next-token logits of each row's last position, through the fused decoder when the model has one.
        `route_at` (request rows `[rows]`, their columns `[rows, width]`): where this forward's tokens' routes go in
        the call's recorded routes (a MoE has no fused decoder). `vision`: a prefill's pixel_values / image_grid_thw
        (position_ids then `[3, rows, len]`)."""
        if self.decoder is not None:
            return self.decoder(ids, position_ids, mask, cache)
        with self.routing.run(record=True) if route_at is not None else contextlib.nullcontext() as p:
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, logits_to_keep=1,
                                **{self.cache_keyword: cache}, **(vision or {})).logits[:, -1]
        if self.suppressed:
            logits[:, self.suppressed] = float("-inf")
        if route_at is not None:
            rows, cols = (t.cpu() for t in route_at)
            routes = to_routes(p.recorded, self.routing.num_layers).cpu()
            self._routes[rows[:, None], cols] = routes.view(*cols.shape, *routes.shape[1:])
        return logits

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def wake_up(self, tags: list[str] | None = None) -> None:
        """"weights" re-allocates what sleep(level=2) freed (uninitialised: the sync that follows fills every weight).
        With a KV budget (explicit bytes, or CUDA), "kv_cache" allocates the whole pool now, as vLLM does:
        `max_num_seqs` sequences of `max_model_len` tokens, or as many as the budget holds. Without one (CPU), the
        pool is sized to each generate() call instead (a batch rarely needs max_num_seqs x max_model_len)."""
        if (tags is None or "weights" in tags) and self._weights_freed():
            for param, nbytes in zip(self._storages, self._storage_bytes):
                param.untyped_storage().resize_(nbytes)
            self._unfilled = {id(p): name for name, p in reversed(list(self.model.named_parameters(remove_duplicate=False)))}
        if (tags is None or "kv_cache" in tags) and self.max_model_len and self.kv_budget_bytes() is not None:
            self.pool.acquire(self._num_slots(self.max_num_seqs, 1, self.max_model_len), self.max_model_len)

    def sleep(self, level: int = 2) -> None:
        """Level 1 frees the KV cache, the KV kept between turns and the decode graphs (their memory pool and static
        buffers: a graph holds the pool's addresses, so it is captured again after the wake-up, and checked again).
        Level 2 frees the engine's own weights as well (a model passed in is not the engine's): the next sync must
        refill every one of them after wake_up(["weights"]), which a full sync does and LoRA's adapted-only one does not."""
        self.pool.release()
        self.kept = None
        if self.graphs is not None:
            self.graphs.release()
        if level >= 2 and self._storages and not self._weights_freed():
            for param in self._storages:
                param.untyped_storage().resize_(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed blocks back to the device

    def _weights_freed(self) -> bool:
        return bool(self._storages) and self._storages[0].untyped_storage().nbytes() == 0

    def memory_bytes(self) -> dict[str, int]:
        # A model passed in is the training model itself (no copy of its own): the ledger counts it as params.
        adapters = self.adapters.nbytes if self.adapters is not None else 0
        return {"rollout_weights": sum(p.untyped_storage().nbytes() for p in self._storages) + adapters, "kv_cache": self.pool.nbytes}
