"""What a rollout-holding worker (hybrid or split pools) hands the native engine from `actor_rollout_ref.rollout.*`."""

import torch

from rlcore.config import compose
from rlcore.workers.rollout_parts import rollout_kwargs

ROLLOUT = "actor_rollout_ref.rollout"


def kwargs_for(overrides: list[str]) -> dict:
    return rollout_kwargs(compose(["recipe=tiny_cpu", "trainer.seed=1", *overrides]), 0, torch.device("cpu"), rank=0)


def test_graph_keys_reach_the_native_engine():
    kwargs = kwargs_for([f"{ROLLOUT}.cudagraph_capture_sizes=[1,2,8]", f"{ROLLOUT}.enforce_eager=True"])
    assert kwargs["cudagraph_capture_sizes"] == [1, 2, 8] and type(kwargs["cudagraph_capture_sizes"]) is list
    assert kwargs["enforce_eager"] is True
    defaults = kwargs_for([])
    assert defaults["cudagraph_capture_sizes"] is None and defaults["enforce_eager"] is False  # verl's defaults
