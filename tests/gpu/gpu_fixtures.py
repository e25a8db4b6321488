"""Fixtures of the GPU tests, imported by name into each file (a conftest.py here would shadow tests/conftest.py for the
files that import its helpers: pytest's default import mode keys modules by file name)."""

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from dist_utils import free_port


@pytest.fixture
def nccl():
    """A one-rank NCCL group: what a GPU worker has, and where a CPU tensor in a collective raises."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=timedelta(seconds=60))
    yield torch.device("cuda", 0)
