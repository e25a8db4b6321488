"""A stop signal honoured (rlcore.trainer.preemption): the first SIGTERM finishes the step in flight, checkpoints it
and exits 143 with one line; the same command resumes exactly; a second SIGTERM stops at once."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
from e2e_utils import SCORE_IN_CONTROLLER, assert_same_steps

from rlcore.config import compose
from rlcore.trainer.preemption import EXIT_CODE, StopNow, deferred_stop, resume_hint

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sigterm_self_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_the_first_sigterm_is_deferred_and_the_second_stops_at_once():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopNow) as info, deferred_stop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:  # Python runs the handler between bytecodes
            time.sleep(0.01)
        assert stop.requested and stop.seconds_since_signal() >= 0
        _sigterm_self_after(0.2)
        start = time.monotonic()
        time.sleep(30)  # the driver waiting on its workers: the second signal interrupts the wait
    assert info.value.code == EXIT_CODE == 143
    assert time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGTERM) is previous  # the loop's handler is gone with the loop


def test_a_deferred_signal_reaches_the_handler_installed_before_the_loop_when_it_ends():
    """Deferred, not swallowed: the Ray session's handler (stop the run) or a test session's (end the session)."""
    heard = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        with deferred_stop() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not stop.requested and time.monotonic() < deadline:
                time.sleep(0.01)
            assert heard == []  # during the loop only the loop's handler runs
        assert heard == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_nothing_is_installed():
    previous, seen = signal.getsignal(signal.SIGTERM), []

    def loop():
        with deferred_stop() as stop:
            seen.append((stop.requested, signal.getsignal(signal.SIGTERM)))

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join()
    assert seen == [(False, previous)]


def test_the_resume_hint_follows_resume_mode(tmp_path):
    ckpt = str(tmp_path / "ckpt" / "global_step_2")
    auto = compose(["recipe=tiny_cpu"]).trainer
    assert resume_hint(auto, ckpt) == f"to resume, rerun the command with trainer.default_local_dir={tmp_path / 'ckpt'}"
    path = compose(["recipe=tiny_cpu", "trainer.resume_mode=disable"]).trainer
    assert resume_hint(path, ckpt).endswith(f"trainer.resume_mode=resume_path trainer.resume_from_path={ckpt}")
    assert resume_hint(auto, None).startswith("nothing to resume from")


# Scores the response's length mod 3 (advantages that vary, so the update moves the weights). With $STOP_AT_SAMPLE
# set, the STOP_AT_SAMPLE-th call prints MARKER and waits for the test's SIGTERM ($SIGNAL_SENT appears), so the
# signal lands in the middle of a known step. The controller runs it (score_workers=0): one counter sees every call.
SCORER = """
import os, time
calls = 0

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if os.environ.get("STOP_AT_SAMPLE") == str(calls):
        print("MARKER: scoring in step 2", flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.environ["SIGNAL_SENT"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    return float(len(solution_str) % 3)
"""
SAMPLES_PER_STEP = 8 * 4  # train_batch_size x rollout.n below
KEYS = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm")


def tiny_overrides(model_dir, task_dir, scorer, ckpt_dir) -> list[str]:
    """The tiny recipe on the test fixtures (as e2e_utils.tiny_cfg), 3 steps, no validation, no periodic checkpoint."""
    return ["recipe=tiny_cpu", f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={task_dir}/train.parquet",
            f"data.val_files={task_dir}/test.parquet", f"trainer.default_local_dir={ckpt_dir}", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", SCORE_IN_CONTROLLER, "trainer.total_training_steps=3",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,jsonl]",
            f"reward.custom_reward_function.path={scorer}"]


def step_rows(run_dir) -> list[dict]:
    return [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "timing_s/step" in r]


def processes_tagged(tag: str) -> list[psutil.Process]:
    """The processes a run started (the driver's environment is inherited by Ray's and torch's processes)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PREEMPTION_TEST") == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def train(overrides, run_dir, tag, **env) -> subprocess.Popen:
    """`python -m rlcore.train` as a user's job: its own Ray cluster, its output (both streams) in a pipe."""
    return subprocess.Popen([sys.executable, "-m", "rlcore.train", *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": REPO, "PREEMPTION_TEST": tag, **env})


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.usefixtures("ray_cluster")  # the uninterrupted run's (in this process)
def test_sigterm_mid_step_checkpoints_that_step_and_the_same_command_resumes_exactly(tiny_model_dir, tiny_task_dir, tmp_path):
    from rlcore.train import run

    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    straight = tiny_overrides(tiny_model_dir, tiny_task_dir, scorer, tmp_path / "straight" / "ckpt")
    run(compose(straight), str(tmp_path / "straight"))

    # The preempted run: SIGTERM while step 2 is being scored.
    command, run_dir, tag, sent = (tiny_overrides(tiny_model_dir, tiny_task_dir, scorer, tmp_path / "ckpt"), tmp_path / "run",
                                   uuid.uuid4().hex, tmp_path / "sent")
    proc = train(command, run_dir, tag, STOP_AT_SAMPLE=str(SAMPLES_PER_STEP + 1), SIGNAL_SENT=str(sent))
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if "MARKER" in line:
                break
        assert output and "MARKER" in output[-1], "".join(output)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        sent.touch()
        output.extend(proc.stdout)
        code = proc.wait(timeout=120)
        exited = time.monotonic() - signalled
    finally:
        proc.kill()
    text = "".join(output)
    stops = [line for line in output if "rlcore: stopped by SIGTERM" in line]
    assert code == EXIT_CODE, text
    assert len(stops) == 1 and text.count("rlcore: SIGTERM received: finishing the step in flight") == 1, text
    ckpt = tmp_path / "ckpt" / "global_step_2"
    assert stops[0].startswith(f"rlcore: stopped by SIGTERM after global step 2 of 3: checkpoint {ckpt} written ")
    assert stops[0].rstrip().endswith(f"rerun the command with trainer.default_local_dir={tmp_path / 'ckpt'} (exit code 143)")
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert "Traceback" not in text, text
    to_checkpoint = float(stops[0].split(" written ")[1].split(" s ")[0])
    print(f"signal -> checkpoint written {to_checkpoint:.1f} s, signal -> exit {exited:.1f} s (measured by the test)")
    assert [r["step"] for r in step_rows(run_dir)] == [1, 2]

    deadline = time.monotonic() + 30
    while (left := processes_tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"the preempted run left processes: {[(p.pid, p.name()) for p in left]}"

    # The same command again: it resumes from global_step_2 and runs step 3 only, as the uninterrupted run did.
    resumed = train(command, run_dir, tag)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert f"resumed from {ckpt} at global step 2" in out
    assert_same_steps(step_rows(run_dir), step_rows(tmp_path / "straight"), KEYS, first=1)


@pytest.mark.usefixtures("ray_cluster")
def test_sft_stops_at_the_step_boundary_and_resumes_exactly(tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch, capsys):
    """The supervised loop shares the mechanism: SIGTERM while step 2's batch is drawn, in this process."""
    from rlcore.train_sft import compose_sft, run
    from rlcore.trainer.supervised import SupervisedTrainer

    def sft(out):
        cfg = compose_sft([f"model.partial_pretrain={tiny_model_dir}", f"data.train_files=[{tiny_task_dir}/sft.parquet]", "data.val_files=[]",
                           "data.max_length=16", "data.train_batch_size=16", "data.micro_batch_size_per_gpu=4", "optim.lr=3e-3",
                           "trainer.total_training_steps=3", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
                           "model.fsdp_config.dtype=float32", "trainer.logger=[jsonl]", f"trainer.default_local_dir={out}/ckpt"])
        return run(cfg, str(out / "run"))

    def losses(out):
        return {row["step"]: row["train/loss"] for row in map(json.loads, open(out / "run" / "metrics.jsonl"))}

    sft(tmp_path / "straight")
    batches = SupervisedTrainer.batches

    def signalling(self):
        for step, rows in enumerate(batches(self), start=1):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the loop's handler: deferred to the end of step 2
            yield rows

    monkeypatch.setattr(SupervisedTrainer, "batches", signalling)
    session = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a user's process: the test session's would end it
    try:
        with pytest.raises(SystemExit) as info:
            sft(tmp_path / "a")
    finally:
        signal.signal(signal.SIGTERM, session)
    assert info.value.code == EXIT_CODE
    out = capsys.readouterr().out
    assert f"rlcore: stopped by SIGTERM after global step 2 of 3: checkpoint {tmp_path}/a/ckpt/global_step_2 written " in out
    monkeypatch.setattr(SupervisedTrainer, "batches", batches)
    sft(tmp_path / "a")  # the same command resumes (trainer.resume_mode=auto)
    assert losses(tmp_path / "a") == losses(tmp_path / "straight")
