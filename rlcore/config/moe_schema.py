"""Config of mixture-of-experts training (verl's keys): router replay, `actor_rollout_ref.{actor,ref}.router_replay.*`.

The rollout engine and the trainer may route a token to different experts (different kernels, batch shapes, or the
router's weights moving between the old-log-prob pass and the update): the log-probs the update sees are then not
those of the experts that sampled. Router replay forces recorded routes in the training forwards (rlcore.models.router):
- R2: routes recorded in the old-log-prob forward, replayed in the reference's and every update forward;
- R3: routes recorded by the rollout (`rollout.enable_rollout_routing_replay=True`), replayed in the old-log-prob,
  reference and update forwards.
The load-balancing loss is HF's own: `actor_rollout_ref.model.override_config.output_router_logits=True` adds
`router_aux_loss_coef` x the loss (off in every published Qwen MoE config, as RL wants it).

This module imports neither torch nor ray.
"""

from dataclasses import dataclass
from typing import Optional

ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")


@dataclass
class RouterReplayConfig:
    """Router replay for a mixture of experts (`<role>.router_replay.*`, verl's keys)."""

    mode: str = "disabled"  # disabled | R2 (replay the old-log-prob pass's routes) | R3 (replay the rollout's routes)
    record_file: Optional[str] = None  # verl: declared, never read; rlcore refuses a value (routes travel in the batch)
    replay_file: Optional[str] = None  # verl: declared, never read; rlcore refuses a value (routes travel in the batch)


@dataclass
class EngineRouterReplayConfig:
    """verl 0.9's copy of router replay in the Megatron engine's section (`<role>.megatron.router_replay.*`, what its
    engine workers read): None = not set; a value set is moved onto `<role>.router_replay.*` as the config is
    composed (rlcore.config.renamed.ENGINE_COPIES), the one setting rlcore reads."""

    mode: Optional[str] = None  # disabled | R2 | R3, as <role>.router_replay.mode
    record_file: Optional[str] = None  # as <role>.router_replay.record_file (refused: routes travel in the batch)
    replay_file: Optional[str] = None  # as <role>.router_replay.replay_file (refused: routes travel in the batch)


# ---------------------------------------------------------------------------------------------------- rules
# Rules for router replay (`actor_rollout_ref.{actor,ref}.router_replay.*`, `rollout.enable_rollout_routing_replay`).
# `c` is validate's checker (get / error / choice). Whether the model routes at all is
# the workers' check (a config does not know its model's architecture): replay on a dense model fails there, naming
# the key. Imports neither torch nor ray.


ARR = "actor_rollout_ref"
RR = f"{ARR}.actor.router_replay"
RECORD = f"{ARR}.rollout.enable_rollout_routing_replay"


def check_router_replay(c) -> None:
    c.choice(f"{RR}.mode", ROUTER_REPLAY_MODES)
    mode = c.cfg.actor_rollout_ref.actor.router_replay.mode
    for role in ("actor", "ref"):
        for key in ("record_file", "replay_file"):
            if getattr(getattr(c.cfg.actor_rollout_ref, role).router_replay, key) is not None:
                c.error(f"{ARR}.{role}.router_replay.{key}: verl declares it and never reads it; rlcore carries routes in the batch "
                        f"(routed_experts), not in files: drop it")
    if c.cfg.actor_rollout_ref.ref.router_replay.mode != mode:
        c.error(f"{ARR}.ref.router_replay.mode={c.cfg.actor_rollout_ref.ref.router_replay.mode}: the reference replays the actor's routes "
                f"({RR}.mode={mode}); drop the ref key (it follows the actor's)")
    if mode == "R3" and not c.get(RECORD):
        c.error(f"{RR}.mode=R3 replays the rollout's routes, which the rollout records only with {RECORD}=True; set it, or use mode=R2")
    if c.get(RECORD) and mode != "R3":
        c.error(f"{RECORD}=True records routes that only {RR}.mode=R3 replays ({RR}.mode={mode}); set mode=R3, or the key to False")
