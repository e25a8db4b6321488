"""Rules for the prefix grouper (`actor_rollout_ref.actor.use_prefix_grouper`, rlcore/models/prefix_grouper.py).
`c` is validate's checker (get / error)."""

from __future__ import annotations

from rlcore.config.validate_ulysses import role_sp

KEY = "actor_rollout_ref.actor.use_prefix_grouper"


def check_prefix_grouper(c) -> None:
    if not c.get(KEY):
        return
    strategy = c.get("actor_rollout_ref.actor.strategy")
    if strategy == "megatron":
        c.error(f"{KEY}=True packs prompts through the FSDP2 engine's attention; actor_rollout_ref.actor.strategy=megatron "
                "has no such path: use strategy=fsdp2, or use_prefix_grouper=False")
    sp = role_sp(c.get, "actor")
    if sp > 1:  # as verl: a grouped row cannot be split over Ulysses ranks by sequence
        c.error(f"{KEY}=True with Ulysses sequence parallelism (size {sp}): a group's responses all read its one prompt, "
                "which Ulysses would split over ranks; use ulysses_sequence_parallel_size=1, or use_prefix_grouper=False")
    if c.get("actor_rollout_ref.actor.router_replay.mode") != "disabled":
        c.error(f"{KEY}=True with router replay: recorded routes are kept per row token, and grouped rows share their "
                "prompt's tokens; set actor_rollout_ref.actor.router_replay.mode=disabled, or use_prefix_grouper=False")
