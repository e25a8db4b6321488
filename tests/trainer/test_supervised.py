"""The supervised controller loop (rlcore-rm, rlcore-sft) against a scripted worker group: trainer.stop_metric ends the
run at the first validation that passes, and resume replays the batch order and skips a finished run."""

import json
import os

import pytest

from rlcore.config import ConfigError
from rlcore.telemetry.tracking import Tracker
from rlcore.train_rm import compose_rm
from rlcore.train_sft import compose_sft, sft_config_errors
from rlcore.trainer.supervised import SupervisedTrainer, resume_point
from rlcore.workers.reward_trainer import RewardTrainerWorker
from rlcore.workers.sft_trainer import SFTTrainerWorker


class ScriptedGroup:
    """val/exact_match rises by 0.1 per step trained; records the batches it trains on and what it loads."""

    world_size = 2

    def __init__(self):
        self.steps, self.batches, self.loaded = 0, [], []

    def train_batch(self, data):
        self.steps += 1
        self.batches.append(data)
        return {"train/loss": 1.0 / self.steps}

    def evaluate(self, data):
        return {"val/exact_match": 0.1 * self.steps}

    def save_checkpoint(self, path, hf_dir):
        os.makedirs(hf_dir, exist_ok=True)

    def load_checkpoint(self, path):
        self.loaded.append(path)


class Rows:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def batch(self, index, pad, max_length):
        return tuple(index)


def run(tmp_path, total, *overrides):
    cfg = compose_sft([f"trainer.default_local_dir={tmp_path}/ckpt", "data.train_batch_size=4", "trainer.test_freq=2", *overrides])
    resume_from, start = resume_point(cfg.trainer)
    tracker = Tracker([], str(tmp_path / "run"), total, start_step=start)
    group = ScriptedGroup()
    group.steps = start
    try:
        final = SupervisedTrainer(cfg, group, Rows(10), Rows(4), 0, tracker, total, "sft", resume_from).fit()
    finally:
        tracker.close()
    return final, group


def test_stop_when_ends_at_the_first_passing_validation_and_resume_skips_the_finished_run(tmp_path):
    rule = ["trainer.stop_metric=val/exact_match", "trainer.stop_threshold=0.35"]
    final, group = run(tmp_path, 10, *rule)
    assert final["step"] == 4 and final["val/exact_match"] == pytest.approx(0.4) and group.steps == 4  # not at step 2 (0.2)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["global_step_4", "latest_checkpointed_iteration.txt"]
    state = json.load(open(tmp_path / "ckpt" / "global_step_4" / "trainer_state.json"))
    assert state["stopped_by"] == "val/exact_match >= 0.35" and state["metrics"]["train/loss"] == 0.25
    again, group = run(tmp_path, 10, *rule)
    assert group.batches == [] and group.loaded == [] and again["step"] == 4 and again["val/exact_match"] == pytest.approx(0.4)
    assert again["checkpoint"] == str(tmp_path / "ckpt" / "global_step_4" / "sft" / "huggingface")


def test_resume_continues_with_the_batches_the_uninterrupted_run_would_train(tmp_path):
    straight = run(tmp_path / "a", 6, "trainer.save_freq=3")[1].batches
    run(tmp_path / "b", 3)  # 2 batches per epoch of 10 rows: the resumed run starts mid-way through epoch 2
    final, group = run(tmp_path / "b", 6)
    assert group.loaded == [str(tmp_path / "b" / "ckpt" / "global_step_3" / "sft")]
    assert group.batches == straight[3:] and final["step"] == 6 and len(set(straight)) == 6
    fresh = run(tmp_path / "b", 6, "trainer.resume_mode=disable")[1]
    assert fresh.batches == straight and fresh.loaded == []


def test_stop_rule_and_resume_keys_are_checked():
    cfg = compose_sft(["trainer.stop_metric=train/loss", "trainer.stop_mode=lowest", "trainer.resume_mode=resume_path"])
    assert sft_config_errors(cfg) == [
        "trainer.resume_mode=resume_path needs trainer.resume_from_path (a folder such as <trainer.default_local_dir>/global_step_100); "
        "set it or use trainer.resume_mode=auto",
        "trainer.stop_mode=lowest is not max (stop once the metric is >= trainer.stop_threshold) or min (<=)",
        "trainer.stop_metric=train/loss is checked at validation: it needs a val/ metric, data.val_files and trainer.test_freq > 0 "
        "(how often to validate)"]
    with pytest.raises(ConfigError, match="/nonexistent does not exist"):
        resume_point(compose_sft(["trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent"]).trainer)


def test_verls_newer_sft_keys_are_checked_before_ray_starts():
    """verl's sft_trainer keys: its engine and optim group choices compose; an inference-only engine, an unknown
    pad_mode or checkpoint item, and its Megatron engine are refused with the fix."""
    assert sft_config_errors(compose_sft(["engine=fsdp", "optim=fsdp", "data.pad_mode=right", "checkpoint.save_contents=[model,optimizer,extra]"])) == []
    cfg = compose_sft(["engine.forward_only=True", "data.pad_mode=left", "checkpoint.save_contents=[model,weights]"])
    assert sft_config_errors(cfg) == [
        "data.pad_mode=left is not one of no_padding, right, left_right; use data.pad_mode=no_padding",
        "engine.forward_only=True builds verl's inference-only engine, which cannot train; drop it for SFT",
        "checkpoint.save_contents: unknown item(s) ['weights']; choose from ['model', 'optimizer', 'extra', 'hf_model']",
        "checkpoint.load_contents: unknown item(s) ['weights']; choose from ['model', 'optimizer', 'extra', 'hf_model']"]  # it follows
    from rlcore.cli.overrides import explain

    message = "In 'sft_trainer': Could not find 'engine/megatron'\n\nAvailable options in 'engine':\n\tfsdp\nConfig search path:"
    assert explain(message, lambda: None) == "engine=megatron is verl's Megatron SFT engine; rlcore's SFT trainer trains with FSDP2: use engine=fsdp"


COMPOSE = {"sft": compose_sft, "rm": compose_rm}
WORKERS = {"sft": SFTTrainerWorker, "rm": RewardTrainerWorker}  # (the faked group builds none: their schema types the config)


@pytest.mark.parametrize("role", ["sft", "rm"])
def test_data_seed_or_else_trainer_seed_draws_the_batch_order(role):
    def order(*overrides):
        cfg = COMPOSE[role](["data.train_batch_size=4", "data.shuffle=True", *overrides])
        batches = SupervisedTrainer(cfg, ScriptedGroup(), Rows(12), None, 0, None, 6, role).batches()
        return [next(batches) for _ in range(6)]  # two epochs of 3 batches

    by_trainer = order("data.seed=null", "trainer.seed=1")
    assert by_trainer == order("data.seed=null", "trainer.seed=1") != order("data.seed=null", "trainer.seed=2")
    assert order("data.seed=7", "trainer.seed=1") == order("data.seed=7", "trainer.seed=2") != by_trainer  # data.seed wins


@pytest.mark.parametrize("role", ["sft", "rm"])
def test_val_max_rows_caps_the_rows_validated(role):
    class Counting(ScriptedGroup):
        def evaluate(self, data):
            self.seen = getattr(self, "seen", []) + list(data)
            return {"val/loss": 1.0}

    def validate(*overrides):
        cfg = COMPOSE[role](["data.train_batch_size=4", *overrides])
        group = Counting()
        metrics = SupervisedTrainer(cfg, group, Rows(10), Rows(11), 0, None, 1, role).validate()
        return metrics["val/rows"], group.seen

    assert validate("data.val_max_rows=null") == (10, list(range(10)))  # every row, whole for each of the 2 ranks
    assert validate("data.val_max_rows=5") == (4, [0, 1, 2, 3])  # the first 5, rounded down to whole rows per rank


@pytest.mark.parametrize("role", ["sft", "rm"])
def test_max_ckpt_to_keep_keeps_only_the_newest_checkpoints(tmp_path, role):
    def saved(root, *overrides):
        cfg = COMPOSE[role]([f"trainer.default_local_dir={root}", "data.train_batch_size=4", "trainer.save_freq=1", *overrides])
        tracker = Tracker([], str(root / "run"), 4)
        try:
            SupervisedTrainer(cfg, ScriptedGroup(), Rows(8), None, 0, tracker, 4, role).fit()
        finally:
            tracker.close()
        return sorted(d for d in os.listdir(root) if d.startswith("global_step_"))

    assert saved(tmp_path / "all", "trainer.max_ckpt_to_keep=null") == [f"global_step_{i}" for i in range(1, 5)]
    assert saved(tmp_path / "two", "trainer.max_ckpt_to_keep=2") == ["global_step_3", "global_step_4"]


def test_sft_model_strategy_picks_the_fsdp2_backend_and_megatron_is_refused():
    assert sft_config_errors(compose_sft(["model.strategy=fsdp"])) == sft_config_errors(compose_sft(["model.strategy=fsdp2"])) == []
    assert sft_config_errors(compose_sft(["model.strategy=megatron"])) == [
        "model.strategy=megatron is not supported for SFT; use model.strategy=fsdp2"]


@pytest.mark.parametrize("role", ["sft", "rm"])
def test_a_run_takes_its_steps_tracker_names_ray_cpus_and_placement_timeout_from_the_config(tmp_path, monkeypatch, role):
    """run_supervised with Ray replaced by recorders: trainer.total_epochs sets the steps, trainer.project_name /
    experiment_name name the tracker's run (and the default checkpoint folder), ray_kwargs.ray_init.num_cpus sizes the
    local cluster, trainer.placement_timeout_s bounds the placement of every pool."""
    import contextlib

    import rlcore.controller.placement as placement
    import rlcore.controller.ray_group as ray_group
    import rlcore.controller.ray_session as ray_session
    import rlcore.telemetry.run_end as run_end
    import rlcore.telemetry.tracking as tracking
    import rlcore.trainer.lifecycle as lifecycle
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.trainer.supervised import run_supervised

    seen = {}

    class RecordingTracker(Tracker):
        def __init__(self, *args, **kwargs):
            seen["tracker"] = (kwargs["project_name"], kwargs["experiment_name"])
            super().__init__(*args, **kwargs)

    class Pool:
        def __init__(self, *args, timeout_s, **kwargs):
            seen["placement_timeout_s"] = timeout_s

        def release(self):
            pass

    class Group(ScriptedGroup):
        def __init__(self, cls, pool, **kwargs):
            super().__init__()

        def init_model(self, total_steps):
            seen["total_steps"] = total_steps

        def kill(self, graceful):
            pass

    @contextlib.contextmanager
    def cluster(address, num_cpus, runtime_env=None):
        seen["num_cpus"] = num_cpus
        yield

    monkeypatch.setattr(ray_session, "ray_cluster", cluster)
    monkeypatch.setattr(tracking, "Tracker", RecordingTracker)
    monkeypatch.setattr(run_end, "finish_run", lambda run_dir, verbosity: None)
    monkeypatch.setattr(lifecycle, "cpus_per_rank", lambda device, ranks: 1)
    monkeypatch.setattr(placement, "ResourcePool", Pool)
    monkeypatch.setattr(placement, "placement_map", lambda groups: "")
    monkeypatch.setattr(placement, "check_shared_dir", lambda groups, path: None)
    monkeypatch.setattr(ray_group, "RayWorkerGroup", Group)
    model = tmp_path / "model"
    build_char_tokenizer().save_pretrained(str(model))
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    cfg = COMPOSE[role]([f"model.path={model}", "data.train_batch_size=4", "trainer.logger=[]", "trainer.total_epochs=3",
                         "trainer.project_name=proj", "trainer.experiment_name=exp", "ray_kwargs.ray_init.num_cpus=3",
                         "trainer.placement_timeout_s=7.5"])
    final = run_supervised(cfg, str(tmp_path / "run"), role, WORKERS[role], lambda cfg, tok: (Rows(10), None), [], ())
    assert seen == {"tracker": ("proj", "exp"), "num_cpus": 3, "placement_timeout_s": 7.5, "total_steps": 6}  # 3 epochs x 2 batches
    assert final["step"] == 6 and final["checkpoint"] == str(tmp_path / "checkpoints" / "proj" / "exp" / "global_step_6" / role / "huggingface")
