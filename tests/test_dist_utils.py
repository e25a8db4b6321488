"""The multi-rank test harness itself: what it retries and what it does not."""

import os
import resource

import pytest
import torch.multiprocessing as mp
from dist_utils import spawn_ranks


def _abort() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    os.abort()


def _abort_first_time(rank: int, port: int, flag: str) -> None:
    if rank == 1 and not os.path.exists(flag):
        open(flag, "w").close()
        _abort()  # what a C++ std::terminate in a gloo thread looks like from outside: SIGABRT


def _always_abort(rank: int, port: int) -> None:
    if rank == 1:
        _abort()


def _raise(rank: int, port: int) -> None:
    raise ValueError(f"rank {rank} failed")


def test_a_rank_killed_by_a_signal_is_retried_once_on_a_new_port(tmp_path, capfd):
    ports = []
    spawn_ranks(_abort_first_time, 2, lambda port: (ports.append(port), (port, str(tmp_path / "aborted")))[1])
    assert len(ports) == 2 and "retrying once" in capfd.readouterr().err


def test_a_second_abort_or_a_python_error_fails():
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawn_ranks(_always_abort, 2, lambda port: (port,))
    with pytest.raises(mp.ProcessRaisedException, match="ValueError: rank"):
        spawn_ranks(_raise, 2, lambda port: (port,))
