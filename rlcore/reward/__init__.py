"""Rewards: rule scorers by data_source and the custom reward-function loader."""

from rlcore.reward.custom import load_custom_reward_fn
from rlcore.reward.scorers import (
    default_compute_score,
    gsm8k_score,
    register_scorer,
    registered_data_sources,
    tiny_add_score,
)

__all__ = [
    "default_compute_score",
    "gsm8k_score",
    "load_custom_reward_fn",
    "register_scorer",
    "registered_data_sources",
    "tiny_add_score",
]
