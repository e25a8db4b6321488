"""Every shell command in the README and docs/ runs as pasted: the docs cannot drift from the code again.

Each ```bash block is read the way bash reads it (a backslash continues a line only as its last character; `#`
starts a comment; `$HOME` expands), then each command is checked by what it is:
- rlcore-train / python -m rlcore.train: it composes (each job of an -m sweep), and the doctor finds no error in
  it (`where="elsewhere"`: the GPU recipes' models and data are not on this machine, and the tiny demo's assets
  are built by `make train`);
- rlcore-plan: it runs, in this process, and ends without a config error (an OOM verdict is an answer, not a
  broken command);
- make: the targets exist; pip install: the extras exist in setup.cfg and the constraint files in the repository;
- python -m <module>: the module's --help works (the data preparation scripts), or it runs (rlcore.cli.versions);
- a few programs that need the network or a cluster (git, hf, ray start) are named in SKIPPED, with why.
An unknown program fails the test, so a new kind of command gets a check when it is written.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
SKIPPED = {"git": "needs the network", "hf": "downloads from the hub", "ray": "starts a cluster on other machines",
           "python3": "`python3 -m venv`: makes a venv", ".": "activates a venv", "source": "activates a venv", "cd": "moves"}


def logical_lines(block: str) -> list[str]:
    """Bash's lines: a trailing backslash joins the next line (only when it is the very last character)."""
    lines, current = [], ""
    for line in block.splitlines():
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    return [line for line in lines + [current] if line.strip()]


def commands(doc: str) -> list[list[str]]:
    text = (REPO / doc).read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in logical_lines(block):
            words = [os.path.expandvars(w) for w in shlex.split(line, comments=True)]
            while words:  # `a && b`
                cut = words.index("&&") if "&&" in words else len(words)
                if words[:cut]:
                    found.append(words[:cut])
                words = words[cut + 1:]
    return found


# A command that rehearses a full-size recipe on fake tensors (--rehearse: every phase of a 7B or 30B model, 45-90 s
# on 2 cores) goes to the demo lane (`make test-demos`); `make test` rehearses a 7B-shaped recipe in
# tests/cli/test_rehearsal.py.
ALL = [pytest.param(doc, i, cmd, id=f"{doc}:{i}:{' '.join(cmd)[:60]}", marks=[pytest.mark.demo] if "--rehearse" in cmd else [])
       for doc in DOCS for i, cmd in enumerate(commands(doc))]


def program(cmd: list[str]) -> tuple[str, list[str]]:
    """(what runs, its arguments): env assignments dropped; `python -m x` and venv pythons named by the module."""
    while cmd and re.match(r"^[A-Z_]+=", cmd[0]):
        cmd = cmd[1:]
    if cmd[0].endswith("python") and cmd[1:2] == ["-m"]:
        return cmd[2], cmd[3:]
    return cmd[0], cmd[1:]


def check_train(args: list[str]) -> None:
    from rlcore.cli.overrides import expand_sweep, split_argv
    from rlcore.cli.plan import composer
    from rlcore.config import compose
    from rlcore.train import refuse_what_does_not_compose

    refuse_what_does_not_compose(args, "ppo_trainer", compose)  # SystemExit on a command that does not compose
    config_name, overrides, sweep, _ = split_argv(args, "ppo_trainer")
    compose_fn, doctor = composer(config_name)
    for job in expand_sweep(overrides, basic=sweep is True) if sweep else [overrides]:
        result = doctor(compose_fn(job), "elsewhere")
        assert not result.errors, f"{job}: {result.errors}"


def check_plan(args: list[str], capsys) -> None:
    from rlcore.cli.plan import main

    code = main(args if "--elsewhere" in args else ["--elsewhere", *args])
    out, err = capsys.readouterr()
    assert code == 0 or "config error(s)" not in out and not err, out + err


def setup_extras() -> set[str]:
    text = (REPO / "setup.cfg").read_text().split("[options.extras_require]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^(\w+) =", text, re.M))


def check_pip(args: list[str]) -> None:
    for i, word in enumerate(args):
        if word == "-c":
            assert (REPO / args[i + 1]).is_file(), f"constraint file {args[i + 1]} is not in the repository"
        extras = re.match(r"^(?:\.|rlcore)\[([\w,]+)\]$", word)
        if extras:
            missing = set(extras.group(1).split(",")) - setup_extras()
            assert not missing, f"extras {missing} are not in setup.cfg"


def check_make(args: list[str]) -> None:
    makefile = (REPO / "Makefile").read_text()
    for target in [a for a in args if "=" not in a and not a.startswith("-")]:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}: no such target"


def check_module(module: str, args: list[str]) -> None:
    run = [sys.executable, "-m", module] + ([] if module == "rlcore.cli.versions" else ["--help"])
    done = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("doc, index, cmd", ALL)
def test_command_runs_as_pasted(doc, index, cmd, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the docs' relative paths (tool_configs/..., .cache/...) are from the repository root
    name, args = program(cmd)
    if any("vllm_venv" in word for word in cmd) and importlib.util.find_spec("vllm") is None:
        pytest.skip("a command for vLLM's venv: `make test-vllm` checks it there (tests/test_readme.py -k vllm_venv)")
    if name in SKIPPED:
        pytest.skip(f"{name}: {SKIPPED[name]}")
    if name in ("rlcore-train", "rlcore.train"):
        check_train(args)
    elif name in ("rlcore-plan", "rlcore.cli.plan"):
        check_plan(args, capsys)
    elif name == "make":
        check_make(args)
    elif name == "pip":
        check_pip(args)
    elif name.startswith("rlcore."):
        check_module(name, args)
    else:
        pytest.fail(f"{doc}: a command this test does not know how to check: {' '.join(cmd)} (add a check, or to SKIPPED with why)")


def test_the_docs_have_the_commands_a_user_pastes_first():
    names = [program(p.values[2])[0] for p in ALL]
    assert len(ALL) >= 30 and names.count("rlcore-train") + names.count("rlcore.train") >= 5 and "rlcore-plan" in names


def test_the_readme_stays_a_page():
    # The README grew to 1,201 lines once; the details live in docs/ (the site), the README points there.
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200): move the details into a page under docs/"
    hashes = [line for line in lines if re.search(r"\bat [0-9a-f]{7,}\b|\b[0-9a-f]{7}\b \(", line)]
    assert not hashes, f"README.md names commits (run logs belong in docs/benchmarks.md): {hashes}"


@pytest.mark.parametrize("doc", DOCS)
def test_lists_render_as_lists(doc):
    # GitHub reads a list right after a paragraph line, and nested two spaces in; Python-Markdown (the site's engine)
    # needs a blank line before it and four spaces, or prints the items as one run-on paragraph.
    markdown = pytest.importorskip("markdown")
    html = markdown.markdown((REPO / doc).read_text(), extensions=["tables", "fenced_code"])
    runs = [p[:80] for p in re.findall(r"<p>(.*?)</p>", html, re.S) if re.search(r"\n\s*(?:[-*]|\d+\.) ", p)]
    assert not runs, f"{doc}: list items rendered as a paragraph (add a blank line before the list, indent nested items 4 spaces): {runs}"


def test_every_page_is_in_the_sites_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")]
    assert [p for p in pages if f": {p}" not in nav] == [], "add each page under docs/ to mkdocs.yml's nav"


def test_a_backslash_followed_by_a_comment_does_not_continue_the_command():
    # The README's verl block once had `python -m rlcore.train \            # or: rlcore-train` as its first line.
    assert logical_lines("a \\  # note\n  b=1") == ["a \\  # note", "  b=1"]


def test_the_7b_recipe_header_gives_the_plans_figures():
    from rlcore.cli.plan import composer

    compose_fn, doctor = composer("ppo_trainer")
    roles = {r.role: r for r in doctor(compose_fn(["recipe=qwen2_7b_grpo"]), "elsewhere").memory.roles}
    header = (REPO / "recipes/qwen2_7b_grpo.yaml").read_text()
    update, rollout = roles["actor update"], roles["rollout"]
    assert f"{update.peak:.1f} GiB = {100 * update.peak / update.capacity:.0f}% of the 80 GB" in header
    kv, seqs = re.search(r"KV cache ([\d.]+) GiB: (\d+) sequences", rollout.note).groups()
    assert f"leaves {kv} GiB of KV" in header and f"cache, {seqs} full-length sequences" in header
