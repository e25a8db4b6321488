"""A compute_score for interaction runs (custom_reward_function.path): the interaction's verdict on the last answer,
extra_info["turn_scores"][-1] (0 when it never answered: the trajectory ended inside its first turn)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    scores = (extra_info or {}).get("turn_scores") or []
    return float(scores[-1]) if scores else 0.0
