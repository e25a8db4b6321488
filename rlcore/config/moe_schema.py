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
