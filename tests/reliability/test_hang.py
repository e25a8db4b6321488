"""Hangs become errors: a worker stopped mid-step (SIGSTOP) ends the run within the stated bound, naming the rank
that stopped answering and its log, and leaves no process of the run behind."""

import time

import pytest

from e2e_utils import tiny_cfg
from rlcore.train import run

STOPPER = """
import os, signal, psutil
COUNT = {count_file!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    n = int(open(COUNT).read()) + 1 if os.path.exists(COUNT) else 1
    open(COUNT, "w").write(str(n))
    if n == {stop_at}:
        ranks = sorted((p for p in psutil.process_iter(["cmdline"]) if any("ActorRolloutRefWorker" in part for part in (p.info["cmdline"] or []))),
                       key=lambda p: p.create_time())
        open({pid_file!r}, "w").write(str(ranks[-1].pid))
        ranks[-1].send_signal(signal.SIGSTOP)
    return 0.0
"""


@pytest.mark.slow
def test_a_stopped_worker_ends_the_run_naming_it(tiny_model_dir, tiny_task_dir, tmp_path):
    scorer = tmp_path / "stopper.py"
    scorer.write_text(STOPPER.format(count_file=str(tmp_path / "count"), stop_at=2 * 8 * 4 + 1, pid_file=str(tmp_path / "pid")))
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=6", "trainer.test_freq=-1", "trainer.save_freq=2",
                   "trainer.val_before_train=False", f"custom_reward_function.path={scorer}", "reward_model.score_workers=0",
                   "trainer.hang_timeout_s=5")
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        run(cfg, str(tmp_path / "run"))
    took = time.monotonic() - start
    pid = int((tmp_path / "pid").read_text())
    message = str(info.value)
    print(f"{message}\n(detected and cleaned up {took:.1f} s after the run started)")
    assert message.startswith("rlcore: workers stopped answering at global step 3:")
    assert f"pid {pid} on " in message and "STOPPED (SIGSTOP or a debugger): this is the rank holding the others" in message
    assert "trainer.hang_timeout_s=5" in message and f"resume from {tmp_path}/ckpt/global_step_2" in message
    # bound: 5 s + 2 x the slowest earlier call of the stuck method (well under a second here), after 2 steps
    assert took < 90, took
    import psutil

    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # the stopped rank is gone too
