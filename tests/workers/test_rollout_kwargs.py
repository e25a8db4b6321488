"""What the actor/rollout worker hands the native engine from `actor_rollout_ref.rollout.*`."""

from types import SimpleNamespace

import torch

from rlcore.config import compose
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

ROLLOUT = "actor_rollout_ref.rollout"


def kwargs_for(overrides: list[str]) -> dict:
    worker = SimpleNamespace(config=compose(["recipe=tiny_cpu", *overrides]), tokenizer=SimpleNamespace(pad_token_id=0),
                             device=torch.device("cpu"), rank=0)
    return ActorRolloutRefWorker._rollout_kwargs(worker, seed=1)


def test_graph_keys_reach_the_native_engine():
    kwargs = kwargs_for([f"{ROLLOUT}.cudagraph_capture_sizes=[1,2,8]", f"{ROLLOUT}.enforce_eager=True"])
    assert kwargs["cudagraph_capture_sizes"] == [1, 2, 8] and type(kwargs["cudagraph_capture_sizes"]) is list
    assert kwargs["enforce_eager"] is True
    defaults = kwargs_for([])
    assert defaults["cudagraph_capture_sizes"] is None and defaults["enforce_eager"] is False  # verl's defaults
