"""User algorithms from a file register by name, once per process, with errors naming the key."""

import pytest
import torch

from rlcore.algos import ADV_ESTIMATORS, compute_advantage
from rlcore.algos.custom import load_custom_algorithms

USER_FILE = """
from rlcore.algos import ADV_ESTIMATORS

@ADV_ESTIMATORS.register("sign_of_score")
def sign_of_score(token_level_rewards, response_mask, **_):
    adv = token_level_rewards.sum(-1).sign().unsqueeze(-1) * response_mask
    return adv, adv
"""


def test_a_file_registers_an_estimator_once(tmp_path):
    path = tmp_path / "algos.py"
    path.write_text(USER_FILE)
    load_custom_algorithms(str(path))
    load_custom_algorithms(str(path))  # the controller and a colocated worker may both load it: no clash
    assert "sign_of_score" in ADV_ESTIMATORS
    adv, _ = compute_advantage("sign_of_score", token_level_rewards=torch.tensor([[0.0, -3.0], [2.0, 0.0]]),
                               response_mask=torch.ones(2, 2))
    assert adv.tolist() == [[-1.0, -1.0], [1.0, 1.0]]


def test_missing_and_broken_files_name_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="custom_algorithms.path=.*does not exist"):
        load_custom_algorithms(str(tmp_path / "nope.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("def oops(:\n")
    with pytest.raises(ImportError, match="custom_algorithms.path=.*failed to load: SyntaxError"):
        load_custom_algorithms(str(broken))
    load_custom_algorithms(None)  # unset: nothing to load
