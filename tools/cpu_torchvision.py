"""Installs torchvision's Python half into a venv whose torch is a CPU build.

Why: vision-language models need torchvision on the Python side only (transformers' Qwen-VL image processors resize
and normalise with `torchvision.transforms.v2`; vLLM's Qwen-VL and Qwen3.5 modules import those processors). PyPI's
torchvision wheels for Linux carry CUDA kernels (`_C.so` links libtorch_cuda, which a CPU torch lacks), so with
the CPU torch `import torchvision` fails ("operator torchvision::nms does not exist": two fake-kernel registrations
are not guarded by torchvision's own "are the compiled ops loaded?" check, as every other one is). There is no CPU
wheel on PyPI and no sdist to build one from.

What it does: downloads the wheel that matches the venv's torch (no dependencies, so torch is never swapped), drops
its compiled parts (`_C.so`, `image.so`, the bundled CUDA libraries), guards those two registrations the way
torchvision guards the rest, rewrites the wheel's RECORD and installs it. What is lost: torchvision's compiled ops
(nms, roi_align, ...; they raise if called) and its native JPEG/PNG decoders (PIL decodes instead). rlcore calls
neither. On a CUDA machine use the torchvision that matches your torch instead; this is for CPU venvs.

    python tools/cpu_torchvision.py --python .venv/bin/python
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# torch release -> the torchvision release built against it (torchvision's own compatibility table).
TORCHVISION_FOR_TORCH = {"2.13": "0.28.0", "2.12": "0.27.1", "2.11": "0.26.0", "2.10": "0.25.0"}
_DROPPED_SUFFIXES = (".so",)
_DROPPED_DIRS = ("torchvision.libs/",)
_UNGUARDED = '@torch.library.register_fake("torchvision::{op}")\ndef meta_{op}('
_GUARDED = (
    "@(torch.library.register_fake(\"torchvision::{op}\") if torchvision.extension._has_ops() else (lambda f: f))\n"
    "def meta_{op}("
)


def torchvision_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    torch_release = ".".join(out.split("+")[0].split(".")[:2])
    if "+cpu" not in out and "cpu" not in out:
        print(f"note: torch {out} is not tagged +cpu; a CUDA torch should use PyPI's torchvision as is")
    try:
        return TORCHVISION_FOR_TORCH[torch_release]
    except KeyError:
        sys.exit(f"no torchvision release known for torch {out}; add it to TORCHVISION_FOR_TORCH")


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def strip_wheel(src: Path, dst: Path) -> list[str]:
    """Writes `src` without its compiled parts and with the two registrations guarded; returns what it changed."""
    changed: list[str] = []
    with zipfile.ZipFile(src) as zin:
        files = {n: zin.read(n) for n in zin.namelist()}
    record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    for name in list(files):
        if name.endswith(_DROPPED_SUFFIXES) or name.startswith(_DROPPED_DIRS):
            del files[name]
            changed.append(f"dropped {name}")
    meta = "torchvision/_meta_registrations.py"
    text = files[meta].decode()
    for op in ("nms", "qnms"):
        before = _UNGUARDED.format(op=op)
        if before not in text:
            sys.exit(f"{meta} no longer registers torchvision::{op} as expected; check the wheel by hand")
        text = text.replace(before, _GUARDED.format(op=op))
        changed.append(f"guarded torchvision::{op}'s fake kernel")
    files[meta] = text.encode()
    rows = [_record_line(n, d) for n, d in files.items() if n != record_name] + [[record_name, "", ""]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    files[record_name] = buf.getvalue().encode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the venv's interpreter")
    args = parser.parse_args(argv)
    version = torchvision_version(args.python)
    with tempfile.TemporaryDirectory() as tmp:
        down, out = Path(tmp, "down"), Path(tmp, "out")
        out.mkdir()
        subprocess.run(
            [args.python, "-m", "pip", "download", "-q", "--no-deps", f"torchvision=={version}", "-d", str(down)],
            check=True,
        )
        (wheel,) = down.glob("torchvision-*.whl")
        changed = strip_wheel(wheel, out / wheel.name)
        subprocess.run(
            [args.python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(out / wheel.name)],
            check=True,
        )
    print(f"torchvision {version} (Python half) installed: " + "; ".join(c for c in changed if "guarded" in c))
    subprocess.run(
        [args.python, "-c", "import torchvision.transforms.v2.functional as F; print('import torchvision: ok')"],
        check=True,
    )


if __name__ == "__main__":
    main()
