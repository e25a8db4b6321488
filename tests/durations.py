"""The test suite's time budget, kept visible: what each test took in the last run against a checked-in baseline.

    .venv/bin/python tests/durations.py            # `make test-durations`: the last run against the baseline
    .venv/bin/python tests/durations.py --update   # the last run (a full `make test`) becomes the baseline

Every pytest run writes .cache/test_durations.json (tests/conftest.py): each test's seconds (set-up, call and
tear-down together), the session's wall-clock seconds and the arguments it ran with. This prints the run's total
against the budget, the tests that grew (both over GREW_X times their baseline and GREW_S seconds longer: noise on
a shared 2-core machine is about 1.3x), the new tests that take GREW_S or more, and those that left. It reports and
never fails: seconds depend on the machine, so no test or CI step asserts them; a reviewer reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAST = os.path.join(ROOT, ".cache", "test_durations.json")
BASELINE = os.path.join(ROOT, "tests", "durations_baseline.json")
BUDGET_S = 20 * 60  # the main suite of `make test` on the 2-core CI machine (docs/contributing.md)
GREW_X, GREW_S = 1.5, 5.0
KEEP_S = 1.0  # the baseline names the tests of at least this many seconds; the others are one sum


def record(path: str, tests: dict[str, float], wall_s: float, args: list[str]) -> None:
    """Writes a run's durations (called by tests/conftest.py at the end of every session)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"wall_s": round(wall_s, 1), "args": args, "tests": {k: round(v, 2) for k, v in sorted(tests.items())}}, f, indent=0)


def baseline_of(run: dict) -> dict:
    """What the baseline keeps of a run: the tests of KEEP_S or more by name, the rest as one count and sum."""
    named = {k: round(v, 1) for k, v in run["tests"].items() if v >= KEEP_S}
    rest = [v for k, v in run["tests"].items() if v < KEEP_S]
    return {"wall_s": run["wall_s"], "args": run["args"], "tests": named, "rest": {"count": len(rest), "seconds": round(sum(rest), 1)}}


def compare(last: dict, base: dict) -> list[str]:
    now, before = last["tests"], base["tests"]
    lines = [f"last run: {len(now)} tests, {last['wall_s'] / 60:.1f} min wall clock (pytest {' '.join(last['args'])})",
             f"baseline: {len(before) + base.get('rest', {}).get('count', 0)} tests, {base['wall_s'] / 60:.1f} min (pytest {' '.join(base['args'])})",
             f"budget:   {BUDGET_S / 60:.0f} min for the main suite on the 2-core CI machine: "
             f"{'within' if last['wall_s'] <= BUDGET_S else 'OVER'} it here ({100 * last['wall_s'] / BUDGET_S:.0f}%)"]
    grew = sorted(((now[k] - before[k], k) for k in now.keys() & before.keys()
                   if now[k] > GREW_X * before[k] and now[k] - before[k] >= GREW_S), reverse=True)
    new = sorted(((v, k) for k, v in now.items() if k not in before and v >= max(GREW_S, KEEP_S)), reverse=True)
    left = sorted(k for k in before.keys() - now.keys())
    lines.append(f"grew (> {GREW_X}x and > +{GREW_S:.0f} s): {len(grew)}")
    lines += [f"  {before[k]:7.1f} s -> {now[k]:7.1f} s  {k}" for _, k in grew]
    lines.append(f"new, {GREW_S:.0f} s or more: {len(new)}")
    lines += [f"  {v:7.1f} s  {k}" for v, k in new]
    if left:
        lines.append(f"in the baseline, not in the last run: {len(left)} (a partial run, or removed)")
    slowest = sorted(now.items(), key=lambda kv: -kv[1])[:10]
    lines.append("slowest 10 of the last run:")
    lines += [f"  {v:7.1f} s  {k}" for k, v in slowest]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="make the last run the baseline (after a full make test)")
    parser.add_argument("--last", default=LAST, help="the run to read (default: %(default)s)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.last):
        print(f"no {os.path.relpath(args.last, ROOT)}: run the suite first (make test)", file=sys.stderr)
        return 1
    with open(args.last) as f:
        last = json.load(f)
    if args.update:
        with open(BASELINE, "w") as f:
            json.dump(baseline_of(last), f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"{os.path.relpath(BASELINE, ROOT)} := the last run ({len(last['tests'])} tests, {last['wall_s'] / 60:.1f} min)")
        return 0
    if not os.path.isfile(BASELINE):
        print(f"no {os.path.relpath(BASELINE, ROOT)} yet: after a full make test, --update makes that run the baseline", file=sys.stderr)
        return 1
    with open(BASELINE) as f:
        base = json.load(f)
    print("\n".join(compare(last, base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
