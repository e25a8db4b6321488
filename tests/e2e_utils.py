"""Shared e2e set-up: the tiny recipe pointed at the test fixtures, small enough for CI."""

import time

import pytest

from rlcore.config import compose

# The rule scorer runs in the controller (score_workers=0): the default's spawned scoring processes cost each run
# about a second of set-up before its first step. Tests of scoring isolation (tests/reliability, tests/reward) ask
# for the processes with reward_model.score_workers=2, and the learning tests run their recipes' defaults.
SCORE_IN_CONTROLLER = "reward_model.score_workers=0"


def tiny_cfg(model_dir, task_dir, out_dir, *overrides, config_name="ppo_trainer"):
    return compose([
        "recipe=tiny_cpu",
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={task_dir}/train.parquet",
        f"data.val_files={task_dir}/test.parquet",
        f"trainer.default_local_dir={out_dir}/ckpt",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", SCORE_IN_CONTROLLER,
        *overrides,
    ], config_name=config_name)


# The straight run of an exact-resume test keeps every step's checkpoint (the tiny recipe keeps only the newest).
KEEP_EVERY_STEP = ("trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=null", "trainer.max_critic_ckpt_to_keep=null")


def resume_overrides(ckpt_dir, step: int) -> tuple[str, str]:
    """A run that resumes from `ckpt_dir`/global_step_`step` (verl's trainer.resume_mode=resume_path)."""
    return "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt_dir}/global_step_{step}"


def assert_same_steps(resumed: list[dict], straight: list[dict], keys, first: int) -> None:
    """Exact resume, checked in two runs instead of three: `straight` trained every step (saving each), `resumed`
    restarted from its checkpoint of step first - 1 and ran only steps first..end, each equal to the straight run's."""
    by_step = {row["step"]: row for row in straight}
    assert [row["step"] for row in resumed] == list(range(first, max(by_step) + 1))  # only the missing steps ran
    for row in resumed:
        for key in keys:
            assert row[key] == pytest.approx(by_step[row["step"]][key], rel=1e-4, abs=1e-6), (row["step"], key)


# What a run measures of its machine rather than computes: seconds, memory, and the rates derived from them.
MEASURED = ("timing_s/", "perf/")


def assert_repeated_bit_for_bit(again: list[dict], first: list[dict]) -> None:
    """Two runs from scratch with the same seeds: every computed metric of every step equal, bit for bit."""
    assert [row["step"] for row in again] == [row["step"] for row in first]
    for a, b in zip(again, first):
        computed = sorted(k for k in b if not k.startswith(MEASURED))
        assert sorted(k for k in a if not k.startswith(MEASURED)) == computed, a["step"]
        differ = {k: (a[k], b[k]) for k in computed if a[k] != b[k]}
        assert not differ, (a["step"], differ)


COMM_LEN = 15  # the kernel keeps a process's name in 15 characters (/proc/<pid>/comm)


def assert_no_workers_left(timeout_s: float = 30.0) -> None:
    """A run on a cluster it joined (the tests' shared one) ended everything it started there: no actor alive, no
    placement group kept, every CPU free and no actor's process still running, but for the worker hosts parked for
    the next run. Killing is asynchronous: waits up to `timeout_s` for it, then names what is left."""
    import psutil
    import ray
    from ray.util.placement_group import placement_group_table

    from rlcore.controller.hosts import warm

    def left() -> list[str]:
        # The worker hosts parked for the next run, and their placement groups, are the cluster's (rlcore.controller.hosts)
        actor_ids, pg_ids = warm().idle() if warm() else (set(), set())
        pgs, every = placement_group_table(), ray._private.state.actors()
        table = [a for actor_id, a in every.items() if actor_id not in actor_ids]
        parked_pids = {every[actor_id]["Pid"] for actor_id in actor_ids if actor_id in every}
        actors = [f"actor {a['ActorClassName']} ({a['State']})" for a in table if a["State"] != "DEAD"]
        groups = [f"placement group {pg_id[:8]} ({pg['state']})" for pg_id, pg in pgs.items() if pg["state"] != "REMOVED" and pg_id not in pg_ids]
        parked = sum(bundle.get("CPU", 0) for pg_id in pg_ids for bundle in pgs[pg_id]["bundles"].values())
        free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU")
        cpus = [] if free + parked == total else [f"{free} of {total} CPUs free ({parked} parked)"]
        # An actor's process is titled ray::<its class> (ray::<class>.<method> while in a call); the cluster's
        # processes are this one's descendants (it started the cluster), another pytest run's are not.
        # Compared on the kernel's 15 characters: a killed process being torn down has no command line left, so psutil
        # can only give its truncated name ("ray::ActorRollo") until it is gone.
        titles = tuple(f"ray::{a['ActorClassName']}"[:COMM_LEN] for a in table)
        procs = [f"process {p.pid} {name}" for p in psutil.Process().children(recursive=True)
                 if p.pid not in parked_pids and (name := _name(p))[:COMM_LEN].startswith(titles)]
        return actors + groups + cpus + procs

    deadline = time.monotonic() + timeout_s
    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not found, f"the run left on the cluster: {found}"


def _name(proc) -> str:
    import psutil

    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""


def refuse_ray(monkeypatch) -> None:
    """For runs that must stop before Ray starts (their errors are found first): reaching Ray fails the test."""
    import rlcore.controller.ray_session as session

    def reached(*_, **__):
        raise AssertionError("the run reached Ray: it should have stopped before")

    monkeypatch.setattr(session, "init_ray", reached)


# A compute_score that counts its calls in a file (with reward_model.score_workers=0 the controller scores them all)
# and, at call `at`, sends `sig` to the newest process of worker class `worker`, writing its pid to `pid_file`.
SIGNALLING_SCORER = """
import os, signal, psutil
COUNT = {count_file!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    n = int(open(COUNT).read()) + 1 if os.path.exists(COUNT) else 1
    open(COUNT, "w").write(str(n))
    if n == {at}:
        # the controller's descendants only (it runs this scorer): another pytest run's cluster has the same names
        ranks = sorted((p for p in psutil.Process().children(recursive=True) if any({worker!r} in part for part in p.cmdline())),
                       key=lambda p: p.create_time())
        open({pid_file!r}, "w").write(str(ranks[-1].pid))
        ranks[-1].send_signal(signal.{sig})
    return 0.0
"""


def signalling_scorer(tmp_path, name: str, at: int, sig: str, worker: str = "ActorRolloutRefWorker") -> str:
    """Writes SIGNALLING_SCORER to tmp_path/name (counting in tmp_path/count, the pid in tmp_path/pid); returns its path."""
    path = tmp_path / name
    path.write_text(SIGNALLING_SCORER.format(count_file=str(tmp_path / "count"), at=at, pid_file=str(tmp_path / "pid"), sig=sig,
                                             worker=worker))
    return str(path)
