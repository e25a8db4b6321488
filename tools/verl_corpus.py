"""Extracts the command lines of verl's example launch scripts into tests/config/verl_corpus/ (issue 45's corpus).

Each script runs under bash as it would for a user, with variables, arithmetic and defaults expanded by bash itself,
but every program it would start is a stub that records its arguments instead: python/python3/torchrun/ray and
anything else are functions that print their argv, and PATH holds no other programs (no network, no file
changes outside a scratch HOME). The invocation of a verl trainer (`-m verl.trainer.main_ppo`, `...sft_trainer`,
a `main_*.py` path) is kept: its module and its overrides, one per line, as verl's Hydra would receive them.

    python tools/verl_corpus.py --verl /path/to/verl/checkout [--out tests/config/verl_corpus]

A script runs without arguments; one that starts no trainer so gets placeholders ($1, $2, ...: PLACEHOLDERS).
The YAML files of the example config folders the scripts name with `--config-path` (other than verl's own trainer
folder) are copied under <out>/configs/, at their path in verl's tree, so the corpus test composes them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A function shadows each program a script may start: it writes the program and its arguments, NUL-separated, into a
# file of its own named by the time of the call (the calls of a pipeline run at once: one shared file interleaved
# them), and succeeds (so `cmd && next` goes on, as on the user's machine).
STUBS = r"""
__record() { printf '%s\0' "$@" > "$CORPUS_OUT/${EPOCHREALTIME/./}.$BASHPID"; return 0; }
for __p in python python3 torchrun ray accelerate deepspeed nvidia-smi pip pip3 huggingface-cli hf wget curl git \
           mkdir rm cp mv ln tee cat ls sleep date hostname ifconfig ip nproc sed awk grep head tail cut wc dirname \
           basename realpath readlink pwd touch chmod find xargs sort uniq tr envsubst which srun sbatch mpirun; do
    eval "$__p() { __record $__p \"\$@\"; }"
done
command_not_found_handle() { __record "$@"; return 0; }
# verl 0.9's scripts pick their device with `python3 -c 'import torch_npu'`: on the GPU machine the corpus stands for
# that import fails, so the probe gets the GPU branch of their `case` blocks (a stub that succeeded chose Ascend's).
for __p in python python3; do
    eval "$__p() { [[ \$1 == -c && \$2 == *'import torch_npu'* ]] && return 1; __record $__p \"\$@\"; }"
done
# A script stops at the first missing file it sources or unset variable it reads (an Ascend toolkit, SLURM_*):
# on the user's machine they exist, so here -e and -u are dropped and a missing file is skipped. -x goes too: its
# trace of a `python3 ... 2>&1 | tee` call is written into the pipe the tee stub closes at once, which kills the call.
set() { local a=() x; for x in "$@"; do [[ $x == -[a-z]* ]] && { x=${x//[eux]/}; [[ $x == - ]] && continue; }; a+=("$x"); done; builtin set "${a[@]}"; }
source() { [[ -f $1 ]] && builtin source "$@"; return 0; }
"""
# The positional arguments of a script that needs them: a device count and a save path for those that read $1 and $2;
# a script's `$@` passes them on to the trainer, where they are no override, so the bare words are dropped again.
PLACEHOLDERS = ("8", "/tmp/verl_corpus_save", "__corpus_arg3__", "__corpus_arg4__")
TRAINER = re.compile(r"(?:^|[./])(fully_async_main|main_ppo|main_generation|fsdp_sft_trainer|sft_trainer|main_[a-z_]+|[a-z_]*trainer[a-z_]*)(?:\.py)?$")


def run_script(script: Path, scratch: Path, positional: bool) -> list[list[str]]:
    """The calls the script makes, each as [program, args...]; `positional`: with PLACEHOLDERS as $1, $2, ..."""
    out = scratch / "calls"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    # HOME names no directory: the corpus must not depend on where it was extracted (a redirection there fails)
    env = {"PATH": str(scratch / "bin"), "HOME": "/home/user", "CORPUS_OUT": str(out)}
    args = " ".join(PLACEHOLDERS) if positional else ""
    # `${LORA_ADAPTER_PATH:?must set ...}`: a variable the user must export (a path of theirs); one stands in for it
    required = sorted(set(re.findall(r"\$\{(\w+):\?", script.read_text(errors="replace"))))
    exports = "".join(f"export {name}=/home/user/{name.lower()}\n" for name in required)
    wrapper = STUBS + f'\nRANDOM=0\n{exports}builtin set -- {args}\nbuiltin source "{script}"\n'
    subprocess.run(["/bin/bash", "-c", wrapper], cwd=scratch, env=env, capture_output=True, timeout=30)
    calls = [path.read_bytes() for path in sorted(out.iterdir(), key=lambda p: int(p.name.split(".")[0]))]
    return [[w.decode() for w in call.split(b"\0") if w] for call in calls]


def trainer_call(calls: list[list[str]]) -> tuple[str, list[str]] | None:
    """(the verl entry point, its overrides) of the first call that starts one; None if the script starts none."""
    for call in calls:
        for i, word in enumerate(call):
            module = call[i + 1] if word == "-m" and i + 1 < len(call) else word
            if module.startswith(("verl.", "recipe.")) or module.endswith(".py"):
                name = TRAINER.search(module.rsplit("/", 1)[-1])
                if name:
                    first = i + 2 if word == "-m" else i + 1
                    return module, [a for a in call[first:] if a.strip() and a not in PLACEHOLDERS]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl", type=Path, required=True, help="a checkout of verl (the corpus is its commit's examples/)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "config" / "verl_corpus")
    args = parser.parse_args(argv)
    scripts = sorted((args.verl / "examples").rglob("*.sh"))
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.args"):
        old.unlink()
    found = 0
    # A fixed scratch path: scripts that write $PWD into an override get the same text on every machine
    scratch = Path(tempfile.gettempdir()) / "verl_corpus_work"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "bin").mkdir(parents=True)
    try:
        for script in scripts:
            rel = script.relative_to(args.verl).as_posix()
            # As a user runs it: without arguments (many read $1 as an option with a default, e.g. the engine's name);
            # a script that stops for want of them (usage: <nproc> <save_path>) runs again with placeholders.
            call = trainer_call(run_script(script, scratch, False)) or trainer_call(run_script(script, scratch, True))
            name = rel[len("examples/"):-len(".sh")].replace("/", "__") + ".args"
            lines = [f"# {rel}"] + ([f"# entry: {call[0]}", *call[1]] if call else ["# entry: none (the script starts no verl trainer)"])
            (args.out / name).write_text("\n".join(lines) + "\n")
            found += call is not None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    copied = copy_example_configs(args.verl, args.out)
    print(f"{len(scripts)} scripts, {found} start a verl trainer: written to {os.path.relpath(args.out)} "
          f"(+ {copied} example config files under configs/)")
    return 0


def copy_example_configs(verl: Path, out: Path) -> int:
    """Copies each example config folder's YAML files that a script names with --config-path (verl's own trainer
    folder is rlcore's config/: not copied)."""
    from rlcore.config import VERL_CONFIG_DIRS

    folders = {line.split("=", 1)[1].strip("/") for args in out.glob("*.args") for line in args.read_text().splitlines()
               if line.startswith("--config-path=") and line.split("=", 1)[1].rstrip("/") not in VERL_CONFIG_DIRS}
    shutil.rmtree(out / "configs", ignore_errors=True)
    copied = 0
    for folder in sorted(folders):
        for yaml_file in sorted((verl / folder).glob("*.yaml")):
            target = out / "configs" / folder / yaml_file.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(yaml_file, target)
            copied += 1
    return copied


if __name__ == "__main__":
    raise SystemExit(main())
