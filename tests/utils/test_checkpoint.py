"""Checkpoints you can trust: a manifest written last, resume verifies it and falls back past a damaged step, and
nothing in a checkpoint is unpickled."""

import os
import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlcore.config import ConfigError
from rlcore.trainer.lifecycle import resume_from
from rlcore.utils import checkpoint
from rlcore.utils.rng import rng_state, set_rng_state


def save_step(root, step, payload=b"x" * 1000):
    tmp = checkpoint.begin(str(root), step)
    with open(os.path.join(tmp, "actor", "__0_0.distcp"), "wb") as f:
        f.write(payload)
    torch.save(checkpoint.controller_state({"epoch": 0, "batch_index": step}, {"global_step": step}), os.path.join(tmp, "data.pt"))
    return checkpoint.publish(str(root), step, tmp, None)


def trainer_cfg(root, mode="auto", path=None):
    return OmegaConf.create({"resume_mode": mode, "default_local_dir": str(root), "resume_from_path": path})


def test_a_truncated_shard_is_named_and_resume_falls_back_to_the_previous_step(tmp_path, capsys):
    good, bad = save_step(tmp_path, 1), save_step(tmp_path, 2)
    assert checkpoint.damage(good) is None and resume_from(trainer_cfg(tmp_path)) == bad
    shard = os.path.join(bad, "actor", "__0_0.distcp")
    with open(shard, "r+b") as f:
        f.truncate(600)
    assert checkpoint.damage(bad) == f"{shard} is 600 bytes, the manifest says 1000 (truncated or overwritten)"
    assert resume_from(trainer_cfg(tmp_path)) == good
    warning = capsys.readouterr().out
    assert f"WARNING: checkpoint {bad} is damaged: {shard} is 600 bytes" in warning and f"resuming from {good} instead" in warning
    # the same size, other bytes: the checksum catches it
    with open(shard, "wb") as f:
        f.write(b"y" * 1000)
    assert checkpoint.damage(bad) == f"{shard} does not match its checksum (corrupted)"
    # asked for explicitly, a damaged step stops the run and names the one to use
    with pytest.raises(ConfigError, match=f"does not match its checksum .*use trainer.resume_from_path={good}"):
        resume_from(trainer_cfg(tmp_path, "resume_path", bad))


def test_an_unfinished_save_is_never_resumed(tmp_path, capsys):
    good = save_step(tmp_path, 1)
    os.remove(os.path.join(save_step(tmp_path, 2), checkpoint.MANIFEST))  # as if the process died before the manifest
    assert resume_from(trainer_cfg(tmp_path)) == good and "has no manifest.json" in capsys.readouterr().out
    os.remove(os.path.join(good, checkpoint.MANIFEST))
    assert resume_from(trainer_cfg(tmp_path)) is None
    assert "no complete checkpoint" in capsys.readouterr().out


def test_a_resume_path_that_does_not_exist_is_named_as_such_with_the_step_to_use(tmp_path):
    kept = save_step(tmp_path, 3)  # the older steps were deleted (trainer.max_actor_ckpt_to_keep)
    with pytest.raises(ConfigError, match=f"{tmp_path}/global_step_1 does not exist; use trainer.resume_from_path={kept}"):
        resume_from(trainer_cfg(tmp_path, "resume_path", str(tmp_path / "global_step_1")))


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling would create the marker file
        return (open, (self.marker, "w"))


def test_a_malicious_pickle_in_a_checkpoint_is_not_executed(tmp_path):
    marker, path = tmp_path / "pwned", tmp_path / "data.pt"
    torch.save({"global_step": 3, "rng": _Payload(str(marker))}, path)
    with pytest.raises(ValueError, match=f"{path} cannot be read as checkpoint state"):
        checkpoint.checkpoint_load(str(path))
    assert not marker.exists()


def test_rng_state_round_trips_without_pickle(tmp_path):
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    torch.save(rng_state(), tmp_path / "rng.pt")
    want = (torch.rand(3), np.random.standard_normal(3), random.random())
    set_rng_state(checkpoint.checkpoint_load(str(tmp_path / "rng.pt")))
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_an_unknown_checkpoint_content_is_refused_with_the_valid_ones():
    key = "actor_rollout_ref.actor.checkpoint.save_contents"
    assert checkpoint.checked_contents(["model", "hf_model"], key) == {"model", "hf_model"}
    with pytest.raises(ValueError, match=r"save_contents=\['model', 'optimiser'\]: unknown item\(s\) \['optimiser'\]; choose from "
                                         r"\['model', 'optimizer', 'extra', 'hf_model'\]"):
        checkpoint.checked_contents(["model", "optimiser"], key)
