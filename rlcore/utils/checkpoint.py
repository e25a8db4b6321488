"""Checkpoint layout and atomic publication.

    {default_local_dir}/global_step_{N}/actor/          sharded model + optimizer (DCP, both engines), scheduler, per-rank RNG
    {default_local_dir}/global_step_{N}/actor/contents.json  what the actor's folder holds (its save_contents)
    {default_local_dir}/global_step_{N}/actor/huggingface/   HF config + tokenizer; the safetensors with "hf_model"
    {default_local_dir}/global_step_{N}/data.pt         dataloader position, controller RNG, KL controller
    {default_local_dir}/global_step_{N}/manifest.json   every file's size and CRC-32, written last
    {default_local_dir}/latest_checkpointed_iteration.txt    N, written last (verl's file name)

A step is written into `global_step_{N}.tmp` and renamed once complete, and the "latest" file is replaced
atomically afterwards, so a crash mid-save never leaves a half-written checkpoint that resume would pick. What
happens to a checkpoint afterwards (a truncated copy, a full disk, bit rot) is caught by the manifest: resume
verifies it, names the damaged file and falls back to the newest step that verifies. Nothing in a checkpoint is
unpickled: RNG and controller state are tensors, lists and numbers read with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib

import torch

from rlcore.utils.checkpoint_contents import CONTENTS, STATE
from rlcore.utils.rng import rng_state, set_rng_state

LATEST = "latest_checkpointed_iteration.txt"
CONTENTS_FILE = "contents.json"
MANIFEST = "manifest.json"
_CHUNK = 16 * 2**20


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


def _crc32(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _files(folder: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, name), folder) for d, _, names in os.walk(folder) for name in names
                  if not (d == folder and name == MANIFEST))


def write_manifest(folder: str) -> None:
    """Every file's size and CRC-32 (zlib: ~1 GB/s), written last: a step without one was never completed."""
    entries = {rel: {"size": os.path.getsize(os.path.join(folder, rel)), "crc32": _crc32(os.path.join(folder, rel))} for rel in _files(folder)}
    with open(os.path.join(folder, MANIFEST + ".tmp"), "w") as f:
        json.dump({"files": entries}, f, indent=1)
    os.replace(os.path.join(folder, MANIFEST + ".tmp"), os.path.join(folder, MANIFEST))


def damage(folder: str) -> str | None:
    """What is wrong with a published step (the first damaged file), or None when it verifies."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isdir(folder):  # a mistyped path, or a step trainer.max_*_ckpt_to_keep deleted
        return f"{folder} does not exist"
    if not os.path.isfile(path):
        return f"{folder} has no {MANIFEST} (its save never completed)"
    try:
        entries = json.load(open(path))["files"]
    except (ValueError, KeyError) as err:
        return f"{path} is unreadable ({err})"
    for rel, want in entries.items():
        file = os.path.join(folder, rel)
        if not os.path.isfile(file):
            return f"{file} is missing"
        if os.path.getsize(file) != want["size"]:
            return f"{file} is {os.path.getsize(file)} bytes, the manifest says {want['size']} (truncated or overwritten)"
        if _crc32(file) != want["crc32"]:
            return f"{file} does not match its checksum (corrupted)"
    return None


def resume_candidate(root: str) -> tuple[str | None, list[str]]:
    """The newest complete, verified step under `root` (None if there is none) and warnings about the damaged
    newer ones it passed over, each naming the file and the step resumed instead."""
    latest = latest_step(root)
    if latest is None:
        return None, []
    steps = sorted((int(d.rsplit("_", 1)[1]) for d in os.listdir(root) if d.startswith("global_step_") and d[12:].isdigit()), reverse=True)
    warnings, skipped = [], []
    for step in [s for s in steps if s <= latest]:
        problem = damage(step_dir(root, step))
        if problem is None:
            warnings += [f"checkpoint {bad} is damaged: {why}; resuming from {step_dir(root, step)} instead" for bad, why in skipped]
            return step_dir(root, step), warnings
        skipped.append((step_dir(root, step), problem))
    return None, [f"checkpoint {bad} is damaged: {why}" for bad, why in skipped] + [f"no complete checkpoint under {root}: starting from scratch"]


def checkpoint_load(path: str):
    """torch.load of checkpoint state without unpickling code; a file that needs pickle is refused by name."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 -- torch raises UnpicklingError or RuntimeError depending on the damage
        raise ValueError(f"{path} cannot be read as checkpoint state (tensors, lists and numbers only; nothing in a checkpoint "
                         f"is unpickled): {str(err).splitlines()[0]}") from err


def publish(root: str, step: int, tmp: str, max_to_keep: int | None) -> str:
    write_manifest(tmp)
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


def checked_contents(values, key: str) -> frozenset[str]:
    """`values` of the config key `key` as a set, an unknown item refused with the valid ones."""
    unknown = sorted(set(values) - set(CONTENTS))
    if unknown:
        raise ValueError(f"{key}={list(values)}: unknown item(s) {unknown}; choose from {list(CONTENTS)}")
    return frozenset(values)


def write_contents(folder: str, contents: frozenset[str]) -> None:
    with open(os.path.join(folder, CONTENTS_FILE), "w") as f:
        json.dump(sorted(contents), f)


def saved_contents(folder: str) -> frozenset[str]:
    """What a role's checkpoint folder holds (one written before contents.json existed held model, optimizer, extra)."""
    path = os.path.join(folder, CONTENTS_FILE)
    return frozenset(json.load(open(path))) if os.path.isfile(path) else frozenset(STATE)


def restore_plan(folder: str, wanted: frozenset[str], key: str, role: str = "actor") -> tuple[frozenset[str], list[str]]:
    """What to restore from a role's checkpoint `folder` when `key` (its load_contents) asks for `wanted`, and a
    note for each state the resume leaves as the run built it. Asking for a state the checkpoint does not hold is
    refused with the fix ("hf_model" is export only: never loaded, as verl)."""
    restore, held = wanted & frozenset(STATE), saved_contents(folder)
    missing = sorted(restore - held)
    if missing:
        raise ValueError(f"{key}={sorted(wanted)} asks for {missing}, but {folder} holds only {sorted(held)} (it was saved "
                         f"without them): drop {missing} from {key} to resume without them")
    left = {"model": f"keeps the initial weights (model.path), not the checkpoint's{'' if 'model' in held else ' (it holds none)'}",
            "optimizer": "starts a fresh optimizer (no AdamW moments)",
            "extra": "restarts its lr schedule at step 0 and does not restore its RNG"}
    return restore, [f"{key} has no {name!r}: the {role} {why}" for name, why in left.items() if name not in restore]


def delete_after_load(path: str, save_freq: int) -> None:
    """trainer.del_local_ckpt_after_load: removes the step folder just resumed from (all roles and data.pt), saying
    so, and that until the next save the run has no checkpoint to resume from. (verl's key means this; its code
    only ever removes local copies of HDFS files, which verl cannot yet resume from.)"""
    shutil.rmtree(path)
    until = f"the next save (trainer.save_freq={save_freq})" if save_freq > 0 else "the end of the run (trainer.save_freq<=0: never)"
    print(f"WARNING: deleted {path} after loading it (trainer.del_local_ckpt_after_load=True): until {until} this run "
          "has no checkpoint to resume from", flush=True)


def controller_state(loader_state: dict, extra: dict) -> dict:
    return {"loader": loader_state, "rng": rng_state(), **extra}


def restore_controller_rng(state: dict) -> None:
    set_rng_state(state["rng"])
