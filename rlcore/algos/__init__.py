"""Algorithm math: pure tensor functions in name registries (advantages, policy losses, KL, aggregation)."""

from rlcore.algos import otb  # noqa: F401  (registers the optimal token baseline estimators)
from rlcore.algos.advantages import ADV_ESTIMATORS, compute_advantage
from rlcore.algos.agg import LOSS_AGGREGATIONS, agg_loss
from rlcore.algos.kl import KL_ESTIMATORS, kl_penalty, make_kl_controller
from rlcore.algos.policy_loss import POLICY_LOSSES
from rlcore.algos.rollout_corr import ROLLOUT_IS_LEVELS, ROLLOUT_RS_LEVELS, rollout_correction

__all__ = ["ADV_ESTIMATORS", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "POLICY_LOSSES", "ROLLOUT_IS_LEVELS", "ROLLOUT_RS_LEVELS", "agg_loss", "compute_advantage",
           "kl_penalty", "make_kl_controller", "rollout_correction"]
