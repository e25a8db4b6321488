"""User algorithms from a file (`custom_algorithms.path`), the way custom_reward_function loads a scorer.

The file registers by name with the registries' decorators, e.g.::

    from rlcore.algos import ADV_ESTIMATORS, POLICY_LOSSES

    @ADV_ESTIMATORS.register("my_adv")
    def my_adv(token_level_rewards, response_mask, index, config, **_):
        ...  # -> (advantages, returns), both [batch, response_len]

and the config then names it: `algorithm.adv_estimator=my_adv`. The controller loads the file before checking
the config; every worker loads it before building its losses (workers are separate processes).
"""

from __future__ import annotations

from rlcore.utils.import_file import import_file


def load_custom_algorithms(path: str | None) -> None:
    if path:
        import_file(path, "custom_algorithms.path")
