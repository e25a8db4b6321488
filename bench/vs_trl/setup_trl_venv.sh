#!/usr/bin/env bash
# Creates the venv TRL runs in for bench/vs_trl.py: TRL and its own transformers/accelerate/datasets, pinned in
# trl_constraints.txt, kept apart from the project's .venv so neither side's versions move the other's.
#
#     bash bench/vs_trl/setup_trl_venv.sh [VENV]      # default: <repo>/.cache/trl_venv
#
# torch is installed first, on its own and pinned: this resolves to the local CPU wheel, and the constraints then
# hold it there (an unconstrained resolve would let pip pick a newer torch and pull several GB of CUDA packages).
# Idempotent: the stamp records the constraints' hash, so a re-run is a no-op until the pins change.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$here/../../.cache/trl_venv}"
constraints="$here/trl_constraints.txt"
stamp="$venv/.trl-installed"
want="$(sha256sum "$constraints" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "TRL venv up to date: $venv" >&2
    exit 0
fi
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q "torch==2.13.0"
"$py" -m pip install -q -c "$constraints" trl transformers accelerate datasets
# Fail here, not in the middle of a benchmark, if the resolve drifted from the pins (e.g. torch swapped).
"$py" -m pip check >&2
"$py" - "$constraints" <<'EOF'
import sys
from importlib.metadata import version
pins = [line.split("#")[0].strip() for line in open(sys.argv[1])]
for name, _, want in (p.partition("==") for p in pins if p):
    got = version(name).split("+")[0]  # torch's local tag (+cpu) is not part of the pin
    assert got == want, f"{name}: installed {got}, pinned {want}"
EOF
echo "$want" > "$stamp"
echo "TRL venv ready: $venv" >&2
