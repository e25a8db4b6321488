"""What every trainer's run does around its loop, whatever the loop: where it resumes from."""

from __future__ import annotations

import os

from rlcore.config import ConfigError
from rlcore.utils.checkpoint import LATEST, damage, resume_candidate


def resume_from(trainer_cfg) -> str | None:
    """The step folder to resume from under trainer.resume_mode: auto (the newest verified step in
    default_local_dir, warning about damaged newer ones), disable (None), or resume_path (trainer.resume_from_path,
    which must verify: a damaged one stops the run, naming the file and the newest good step to use instead)."""
    mode, root = trainer_cfg.resume_mode, os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(trainer_cfg.resume_from_path))
        problem = damage(path)
        if problem is not None:
            parent = os.path.dirname(path)
            good, _ = resume_candidate(parent) if os.path.isfile(os.path.join(parent, LATEST)) else (None, [])
            hint = f"use trainer.resume_from_path={good}" if good and good != path else "point trainer.resume_from_path at a complete global_step_N folder"
            raise ConfigError([f"trainer.resume_from_path: {problem}; {hint}"])
        return path
    path, warnings = resume_candidate(root)
    for warning in warnings:
        print(f"WARNING: {warning}", flush=True)
    return path
