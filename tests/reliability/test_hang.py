"""Hangs become errors: a worker stopped mid-step (SIGSTOP) ends the run within the stated bound, naming the rank
that stopped answering and its log, and leaves no process of the run behind."""

import time

import pytest
from e2e_utils import assert_no_workers_left, signalling_scorer, tiny_cfg

from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)


@pytest.mark.slow
def test_a_stopped_worker_ends_the_run_naming_it(tiny_model_dir, tiny_task_dir, tmp_path):
    scorer = signalling_scorer(tmp_path, "stopper.py", at=2 * 8 * 4 + 1, sig="SIGSTOP")  # the first sample of step 3
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=6", "trainer.test_freq=-1", "trainer.save_freq=2",
                   "trainer.val_before_train=False", f"reward.custom_reward_function.path={scorer}", "reward_model.score_workers=0",
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

    t = time.monotonic()
    assert_no_workers_left()
    print(f"workers gone {time.monotonic() - t:.1f} s after the run ended")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # the stopped rank is gone too
