"""Rules for the reward-model worker (`reward_model.enable=True` and verl's `reward_model.*` keys) and verl's
worker-implementation switch. `c` is validate's checker (get / error / choice / at_least)."""

from __future__ import annotations

RM = "reward_model"


def check_reward_model(c) -> None:
    c.choice("trainer.use_legacy_worker_impl", ("auto", "enable", "disable"))
    if not c.get(f"{RM}.enable"):
        return
    if c.get(f"{RM}.strategy") not in ("fsdp", "fsdp2"):
        c.error(f"{RM}.strategy={c.get(f'{RM}.strategy')} is not supported for the reward model (a frozen forward-only model, "
                f"which FSDP2 shards well); use {RM}.strategy=fsdp2")
    if c.get(f"{RM}.use_reward_loop"):
        c.error(f"{RM}.use_reward_loop=True (verl's reward loop: the reward model served by a rollout engine) is not supported by "
                f"rlcore, which scores with a reward-model worker group (verl's legacy worker path); use {RM}.use_reward_loop=False")
    if c.get("trainer.use_legacy_worker_impl") == "disable":
        c.error("trainer.use_legacy_worker_impl=disable selects verl's new worker implementation for the reward model, which rlcore "
                "does not have; use trainer.use_legacy_worker_impl=auto")
    max_length = c.get(f"{RM}.max_length")
    if max_length is not None:
        c.at_least(f"{RM}.max_length", 2, fix=c.get("data.max_prompt_length") + c.get("data.max_response_length"))
    if c.get(f"{RM}.use_dynamic_bsz"):
        longest = max_length or c.get("data.max_prompt_length") + c.get("data.max_response_length")
        budget = c.get(f"{RM}.forward_max_token_len_per_gpu")
        if budget < longest:
            c.error(f"{RM}.forward_max_token_len_per_gpu={budget} is smaller than the longest scored sequence ({longest} tokens: "
                    f"{RM}.max_length or data.max_prompt_length + data.max_response_length); use {RM}.forward_max_token_len_per_gpu={longest}")
    elif c.get(f"{RM}.micro_batch_size_per_gpu") is None and c.get(f"{RM}.micro_batch_size") is None:
        c.error(f"{RM}.micro_batch_size_per_gpu is required unless {RM}.use_dynamic_bsz=True; use e.g. {RM}.micro_batch_size_per_gpu=8")
    if c.get(f"{RM}.enable_resource_pool"):
        c.at_least(f"{RM}.nnodes", 1, fix=1)
        c.at_least(f"{RM}.n_gpus_per_node", 1, fix=c.get("trainer.n_gpus_per_node"))
