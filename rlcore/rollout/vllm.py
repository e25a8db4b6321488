"""vLLM rollout adapter (CUDA only; `pip install 'rlcore[vllm]'`), written against vLLM 0.32's in-process API.

Layout: one vLLM engine per trainer process with `distributed_executor_backend="external_launcher"`, so vLLM
reuses the trainer's process group, runs its engine core in-process, and its TP groups are consecutive ranks.
Weights are swapped in place with `collective_rpc("reload_weights", weights_iterator=...)` (layer-wise reload,
which re-runs per-layer weight post-processing) between `wake_up(["weights"])` and `wake_up(["kv_cache"])`;
after generation `sleep(level=2)` frees weights and KV cache for training (the next sync reloads every weight).

LoRA runs sync merged weights (W + scaling * B @ A, computed by the trainer tensor by tensor), not adapters. vLLM's
public LoRA path (`enable_lora=True`, `generate(..., lora_request=LoRARequest(name, id, path))`) loads an adapter
from a directory on disk, so an adapter-only sync would write and re-read the adapter every step, runs the punica
LoRA kernels on every token of generation, and level-2 sleep (needed to free the weights for training) is known to
crash with LoRA enabled (vLLM #48337). Merged weights keep generation at base-model speed and the sync on the
same in-place reload as full fine-tuning; what LoRA saves is training memory, not sync volume, on vLLM.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from rlcore.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

INSTALL_HINT = (
    "actor_rollout_ref.rollout.name=vllm needs vLLM on a CUDA machine: pip install 'rlcore[vllm]' "
    "(vLLM pins its own torch build). Without a GPU use actor_rollout_ref.rollout.name=native."
)


def import_vllm():
    try:
        import vllm
    except ImportError as err:  # vLLM missing, or present but its CUDA libraries are not
        raise ImportError(f"{INSTALL_HINT} (import failed: {err})") from err
    return vllm


class VLLMRollout(RolloutEngine):
    keeps_weights = False  # sleep(level=2) discards them: every sync reloads every weight

    def __init__(self, model_path: str, pad_token_id: int, device: torch.device, dtype: str = "bfloat16", override_config: dict | None = None,
                 seed: int = 0, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5, max_model_len: int | None = None,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 8192, enable_chunked_prefill: bool = True,
                 enable_prefix_caching: bool = True, enforce_eager: bool = False, load_format: str = "dummy", engine_kwargs: dict | None = None) -> None:
        vllm = import_vllm()
        if device.type != "cuda":
            raise ValueError(f"{INSTALL_HINT} (trainer.device={device.type})")
        self.pad_token_id = pad_token_id
        self.tp = tensor_parallel_size
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        self.tp_rank, dp_rank = rank % self.tp, rank // self.tp
        # Every rank creates every TP group (new_group is collective); each keeps its own.
        self.tp_group = None
        if self.tp > 1:
            for start in range(0, world, self.tp):
                group = dist.new_group(list(range(start, start + self.tp)))
                if start <= rank < start + self.tp:
                    self.tp_group = group
        # Equal seeds inside a TP group (its ranks must sample identically), distinct across DP replicas.
        self.seed = seed + dp_rank
        self.llm = vllm.LLM(
            model=model_path, skip_tokenizer_init=True, tensor_parallel_size=self.tp, dtype=dtype, seed=self.seed,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, enable_sleep_mode=True,
            distributed_executor_backend="external_launcher", load_format=load_format, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs", hf_overrides=override_config or None,
            **(engine_kwargs or {}),
        )
        self.llm.sleep(level=2)  # dummy weights are worthless; the first sync loads real ones
        self._sampling_cls = vllm.SamplingParams

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # In-process collective_rpc calls the worker directly (no pickling), so the iterator streams lazily.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})

    def wake_up(self, tags: list[str] | None = None) -> None:
        if tags and "kv_cache" in tags:
            self.llm.reset_prefix_cache()  # cached KV was computed by the previous weights
        self.llm.wake_up(tags=tags)

    def sleep(self) -> None:
        self.llm.sleep(level=2)

    def _gather_tp(self, prompts: list[list[int]]) -> tuple[list[list[int]], slice]:
        """TP ranks must submit identical requests: gather the group's prompts, remember this rank's slice."""
        if self.tp_group is None:
            return prompts, slice(0, len(prompts))
        parts: list = [None] * self.tp
        dist.all_gather_object(parts, prompts, group=self.tp_group)
        start = sum(len(p) for p in parts[: self.tp_rank])
        return [p for part in parts for p in part], slice(start, start + len(prompts))

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams) -> RolloutOutput:
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        all_prompts, mine = self._gather_tp(prompts)
        params = self._sampling_cls(
            n=1, max_tokens=sampling.max_tokens, temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k if sampling.top_k > 0 else 0, stop_token_ids=list(sampling.stop_token_ids),
            logprobs=0, detokenize=False, seed=sampling.seed if sampling.seed is not None else None,
        )
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in all_prompts], params, use_tqdm=False)[mine]
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
        return RolloutOutput(responses=responses, response_log_probs=log_probs, response_mask=mask)
