"""PPOTrainer's checkpoint step folder on the controller side, with a stand-in for the actor group:
trainer.del_local_ckpt_after_load deletes the folder a resume loaded."""

import os

from rlcore.config import compose
from rlcore.trainer.ppo import PPOTrainer


class FileActor:
    """The actor group's checkpoint calls, writing and reading one file."""

    def save_checkpoint(self, path, hf_dir):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "weights"), "w").write("trained")

    def load_checkpoint(self, path):
        self.loaded = open(os.path.join(path, "weights")).read()


class Loader:
    def __init__(self):
        self.state = {"epoch": 0, "batch_index": 0}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = state


def trainer(tmp_path, *overrides):
    cfg = compose(["recipe=tiny_cpu", f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=1", *overrides])
    return PPOTrainer(cfg, groups={"actor_rollout": FileActor()}, reward_fn=None, val_reward_fn=None, train_loader=Loader(),
                      val_loader=None, tracker=None, total_steps=4)


def saved_step(tmp_path):
    first = trainer(tmp_path)
    first.global_step = 3
    first.train_loader.state = {"epoch": 0, "batch_index": 3}
    return first.save_checkpoint()


def test_del_local_ckpt_after_load_deletes_the_step_folder_once_loaded(tmp_path, capsys):
    path = saved_step(tmp_path)
    resumed = trainer(tmp_path, "trainer.del_local_ckpt_after_load=True")
    resumed.maybe_resume()
    assert resumed.actor_rollout.loaded == "trained" and resumed.global_step == 3 and resumed.train_loader.state["batch_index"] == 3
    assert not os.path.exists(path) and resumed.last_checkpoint is None  # a worker restart has nothing of it to go back to
    assert (f"WARNING: deleted {path} after loading it (trainer.del_local_ckpt_after_load=True): until the next save "
            "(trainer.save_freq=1) this run has no checkpoint to resume from") in capsys.readouterr().out


def test_by_default_the_loaded_step_folder_stays(tmp_path):
    path = saved_step(tmp_path)
    resumed = trainer(tmp_path)
    resumed.maybe_resume()
    assert resumed.global_step == 3 and os.path.isdir(path) and resumed.last_checkpoint == path
