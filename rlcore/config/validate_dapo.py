"""Rules for verl's DAPO-recipe keys: dynamic sampling (`algorithm.filter_groups`, `data.gen_batch_size`) and the
overlong buffer in its `reward_model.overlong_buffer` form. `c` is validate's checker (get / error)."""

from __future__ import annotations

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")  # verl's names; any scorer extra works too


def check_dynamic_sampling(c) -> None:
    train, gen = c.get("data.train_batch_size"), c.get("data.gen_batch_size")
    if not c.get("algorithm.filter_groups.enable"):
        if gen != train and c.get("actor_rollout_ref.hybrid_engine") is not False:  # split pools: prompts per rollout call
            c.error(f"data.gen_batch_size={gen} differs from data.train_batch_size={train} but only applies with DAPO's dynamic "
                    "sampling; set algorithm.filter_groups.enable=True, or drop data.gen_batch_size")
        return
    if c.get("algorithm.filter_groups.metric") is None:
        c.error(f"algorithm.filter_groups.enable=True needs the value whose spread marks a useful group: set "
                f"algorithm.filter_groups.metric to one of {', '.join(FILTER_METRICS)} (acc: a key your compute_score returns)")
    n = c.get("actor_rollout_ref.rollout.n")
    if n < 2:
        c.error(f"algorithm.filter_groups compares the scores within each prompt's group, and actor_rollout_ref.rollout.n={n} "
                "gives groups of one; use actor_rollout_ref.rollout.n=8 (or more than 1)")
    if gen is None or gen < 1:
        c.error(f"data.gen_batch_size={gen} must be >= 1; use data.gen_batch_size={train} (or a multiple, to waste fewer rounds)")


def check_overlong_buffer(c) -> None:
    if not c.get("reward_model.overlong_buffer.enable"):
        return
    if c.get("reward_model.reward_manager") != "dapo":
        c.error("reward_model.overlong_buffer.enable=True is DAPO's punishment; set reward_model.reward_manager=dapo")
    if (c.get("reward_model.reward_kwargs") or {}).get("overlong_buffer_cfg"):
        c.error("the overlong buffer is set twice (reward_model.overlong_buffer and reward_model.reward_kwargs.overlong_buffer_cfg); "
                "keep one")
    buffer, max_len = c.get("reward_model.overlong_buffer.len"), c.get("data.max_response_length")
    if not 0 < buffer <= max_len:
        c.error(f"reward_model.overlong_buffer.len={buffer} must be in 1..data.max_response_length ({max_len}); "
                f"use reward_model.overlong_buffer.len={max(1, max_len // 4)}")
