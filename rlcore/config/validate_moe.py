"""Rules for router replay (`actor_rollout_ref.{actor,ref}.router_replay.*`, `rollout.enable_rollout_routing_replay`,
rlcore/config/moe_schema.py). `c` is validate's checker (get / error / choice). Whether the model routes at all is
the workers' check (a config does not know its model's architecture): replay on a dense model fails there, naming
the key. Imports neither torch nor ray."""

from __future__ import annotations

from rlcore.config.moe_schema import ROUTER_REPLAY_MODES

ARR = "actor_rollout_ref"
RR = f"{ARR}.actor.router_replay"
RECORD = f"{ARR}.rollout.enable_rollout_routing_replay"


def check_router_replay(c) -> None:
    c.choice(f"{RR}.mode", ROUTER_REPLAY_MODES)
    mode = c.get(f"{RR}.mode")
    for role in ("actor", "ref"):
        for key in ("record_file", "replay_file"):
            if c.get(f"{ARR}.{role}.router_replay.{key}") is not None:
                c.error(f"{ARR}.{role}.router_replay.{key}: verl declares it and never reads it; rlcore carries routes in the batch "
                        f"(routed_experts), not in files: drop it")
    if c.get(f"{ARR}.ref.router_replay.mode") != mode:
        c.error(f"{ARR}.ref.router_replay.mode={c.get(f'{ARR}.ref.router_replay.mode')}: the reference replays the actor's routes "
                f"({RR}.mode={mode}); drop the ref key (it follows the actor's)")
    if mode == "R3" and not c.get(RECORD):
        c.error(f"{RR}.mode=R3 replays the rollout's routes, which the rollout records only with {RECORD}=True; set it, or use mode=R2")
    if c.get(RECORD) and mode != "R3":
        c.error(f"{RECORD}=True records routes that only {RR}.mode=R3 replays ({RR}.mode={mode}); set mode=R3, or the key to False")
