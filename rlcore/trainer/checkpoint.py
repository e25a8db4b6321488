"""Checkpoint layout and atomic publication.

    {default_local_dir}/global_step_{N}/actor/          sharded model + optimizer (DCP), scheduler, per-rank RNG
    {default_local_dir}/global_step_{N}/actor/huggingface/   HF-loadable safetensors + config + tokenizer
    {default_local_dir}/global_step_{N}/data.pt         dataloader position, controller RNG, KL controller
    {default_local_dir}/latest_checkpointed_iteration.txt    N, written last (verl's file name)

A step is written into `global_step_{N}.tmp` and renamed once complete, and the "latest" file is replaced
atomically afterwards, so a crash mid-save never leaves a half-written checkpoint that resume would pick.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import torch

LATEST = "latest_checkpointed_iteration.txt"


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def latest_step(root: str) -> int | None:
    path = os.path.join(root, LATEST)
    if not os.path.isfile(path):
        return None
    step = int(open(path).read().strip())
    return step if os.path.isdir(step_dir(root, step)) else None


def begin(root: str, step: int, role: str = "actor") -> str:
    tmp = step_dir(root, step) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, role), exist_ok=True)
    return tmp


def publish(root: str, step: int, tmp: str, max_to_keep: int | None) -> str:
    final = step_dir(root, step)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = os.path.join(root, LATEST + ".tmp")
    with open(latest_tmp, "w") as f:
        f.write(str(step))
    os.replace(latest_tmp, os.path.join(root, LATEST))
    if max_to_keep:
        steps = sorted(int(d.rsplit("_", 1)[1]) for d in os.listdir(root) if d.startswith("global_step_") and not d.endswith(".tmp"))
        for old in steps[:-max_to_keep]:
            shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return final


def controller_state(loader_state: dict, extra: dict) -> dict:
    return {"loader": loader_state, "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), **extra}


def restore_controller_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
