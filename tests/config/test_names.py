"""The config's lists of implemented names (rlcore.config.names) and the registries that implement them: the
validator reads the lists without importing torch, so each list must be exactly what its registry holds."""

import pytest

from rlcore.algos.registry import Registry
from rlcore.config import names


def test_every_listed_name_is_implemented_and_every_implementation_listed():
    from rlcore.algos.agg import LOSS_AGGREGATIONS
    from rlcore.algos.kl import KL_ESTIMATORS
    from rlcore.reward.manager import REWARD_MANAGERS
    from rlcore.rollout.agent_loop import PARSERS

    assert set(KL_ESTIMATORS.names()) == set(names.KL_ESTIMATORS)
    assert set(LOSS_AGGREGATIONS.names()) == set(names.LOSS_AGG_MODES)
    assert set(REWARD_MANAGERS) == set(names.REWARD_MANAGERS)
    assert set(PARSERS) == set(names.TOOL_CALL_FORMATS)


def test_a_registry_refuses_a_name_the_config_does_not_list():
    registry = Registry("thing", "section.thing", allowed=("known",))
    registry.register("known")(len)
    with pytest.raises(ValueError, match="add it to rlcore.config.names first"):
        registry.register("new")(len)
    Registry("open", "algorithm.adv_estimator").register("anything")(len)  # user-extensible: no list
