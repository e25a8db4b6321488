#!/usr/bin/env bash
# Creates the venv TRL runs in for bench/vs_trl.py (default .cache/trl_venv): its own transformers/accelerate/
# datasets, pinned in trl_constraints.txt, and the project's CPU torch (installed first, then constrained, so pip
# never swaps in a CUDA build). Idempotent: a stamp file marks a finished install.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$here/../../.cache/trl_venv}"
if [ -f "$venv/.trl-installed" ]; then exit 0; fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q -c "$here/trl_constraints.txt" trl transformers accelerate datasets
touch "$venv/.trl-installed"
