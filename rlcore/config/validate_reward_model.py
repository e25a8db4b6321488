"""Rules for the reward-model worker (`reward_model.enable=True` and verl's `reward_model.*` keys) and verl's
worker-implementation switch. `c` is validate's checker (get / error / choice / at_least)."""

from __future__ import annotations

RM = "reward_model"


def uses_token_budgets(rm) -> bool:
    """Whether the reward model's forwards are filled by tokens (`reward_model.forward_max_token_len_per_gpu`) rather
    than by samples (`micro_batch_size_per_gpu`): with use_dynamic_bsz, and under verl's reward loop when no
    micro-batch size is given. verl's reward loop hands the reward model to an inference engine, which batches by
    tokens and takes no micro-batch size, so its scripts set none; rlcore runs the same forward in its reward-model
    worker group and fills it the engine's way. `rm` is the reward_model section."""
    return bool(rm.use_dynamic_bsz or (rm.use_reward_loop and rm.micro_batch_size_per_gpu is None and rm.micro_batch_size is None))


def check_reward_model(c) -> None:
    c.choice("trainer.use_legacy_worker_impl", ("auto", "enable", "disable"))
    if not c.get(f"{RM}.enable"):
        return
    if c.get(f"{RM}.strategy") not in ("fsdp", "fsdp2"):
        c.error(f"{RM}.strategy={c.get(f'{RM}.strategy')} is not supported for the reward model (a frozen forward-only model, "
                f"which FSDP2 shards well); use {RM}.strategy=fsdp2")
    if c.get("trainer.use_legacy_worker_impl") == "disable":
        c.error("trainer.use_legacy_worker_impl=disable selects verl's new worker implementation for the reward model, which rlcore "
                "does not have; use trainer.use_legacy_worker_impl=auto")
    max_length = c.get(f"{RM}.max_length")
    if max_length is not None:
        c.at_least(f"{RM}.max_length", 2, fix=c.get("data.max_prompt_length") + c.get("data.max_response_length"))
    if uses_token_budgets(c.get(RM)):
        longest = max_length or c.get("data.max_prompt_length") + c.get("data.max_response_length")
        budget = c.get(f"{RM}.forward_max_token_len_per_gpu")
        if budget < longest:
            c.error(f"{RM}.forward_max_token_len_per_gpu={budget} is smaller than the longest scored sequence ({longest} tokens: "
                    f"{RM}.max_length or data.max_prompt_length + data.max_response_length); use {RM}.forward_max_token_len_per_gpu={longest}")
    elif c.get(f"{RM}.micro_batch_size_per_gpu") is None and c.get(f"{RM}.micro_batch_size") is None:
        c.error(f"{RM}.micro_batch_size_per_gpu is required unless {RM}.use_dynamic_bsz=True or {RM}.use_reward_loop=True (either fills "
                f"each forward with {RM}.forward_max_token_len_per_gpu tokens); use e.g. {RM}.micro_batch_size_per_gpu=8")
    if c.get(f"{RM}.enable_resource_pool"):
        c.at_least(f"{RM}.nnodes", 1, fix=1)
        c.at_least(f"{RM}.n_gpus_per_node", 1, fix=c.get("trainer.n_gpus_per_node"))
