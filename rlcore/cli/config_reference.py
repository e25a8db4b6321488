"""The config reference pages (docs/reference/*.md), generated from the schema dataclasses: one page per trainer.

The dataclasses are the one source of truth: each row's type is the field's annotation, its default the field's
default (as the trainer's root builds it, so `OptimConfig(lr=1e-5)` shows 1e-5), its meaning the field's comment in
the schema source (the trailing `# ...` on the field's line, else the comment lines directly above it). The status
comes from rlcore/config/key_status.py (refused, no effect) and verl's key list (as in verl, rlcore only).

    python -m rlcore.cli.config_reference           # writes the pages
    python -m rlcore.cli.config_reference --check   # exit 1 naming the stale pages (tests/cli/test_config_reference.py)

This module imports neither torch nor ray.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import inspect
import io
import json
import re
import sys
import tokenize
import typing
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from rlcore.config import compose
from rlcore.config.key_status import REFUSED, matching, no_effect_reason
from rlcore.config.renamed import renamed_from
from rlcore.config.rm_schema import RMTrainerConfig, rm_config_errors
from rlcore.config.schema import PPOConfig
from rlcore.config.sft_schema import SFTTrainerConfig
from rlcore.config.validate import diagnose
from rlcore.config.verl_features import not_a_verl_key, verl_feature
from rlcore.train_rm import compose_rm
from rlcore.train_sft import compose_sft, sft_config_errors

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO_ROOT / "docs" / "reference"
# CI clones the repo with shared/ beside it, as on developer machines (tests/config/test_schema.py reads them too):
# verl 0.9's tree, the one rlcore's keys follow, and verl 0.8's, whose names rlcore still accepts
VERL_KEYS = REPO_ROOT.parent / "shared" / "reference" / "verl_0.9_config_keys.txt"
VERL_08_KEYS = REPO_ROOT.parent / "shared" / "reference" / "verl_config_keys.txt"
COMMAND = "python -m rlcore.cli.config_reference"
FAMILIES = ("as in verl", "renamed", "rlcore only", "refused", "no effect", "not compared")

# verl trees other than the one verl_config_keys.txt lists: verl's key names, defaults not listed there, so not
# compared (the sections tests/config/test_schema.py exempts from its default check, and verl's DAPO recipe keys)
OTHER_VERL_TREES = {
    "verl's megatron trainer tree": ("*.megatron.*",),
    "verl's fully-async recipe": ("async_training.*", "rollout.*"),
    "verl's DAPO recipe": ("data.gen_batch_size", "algorithm.filter_groups.*", "reward_model.overlong_buffer.*"),
}


@dataclasses.dataclass(frozen=True)
class Page:
    file: str  # under docs/reference
    title: str
    schema: type  # the trainer's root dataclass
    entry: str  # how the trainer is run
    errors: Callable[[list], list]  # overrides -> the trainer's validation messages
    verl_keys: Optional[Path]  # verl's key list for this trainer; None: no list to compare against
    verl_lacks: str = ""  # why verl has no such trainer: then every key not refused or without effect is rlcore's own


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    meaning: str
    family: str  # one of FAMILIES
    status: str  # the cell: the family with its reason


PAGES = (
    Page("config.md", "PPO trainer config", PPOConfig, "rlcore-train", lambda o: diagnose(compose(o))[1], VERL_KEYS),
    Page("sft.md", "SFT trainer config", SFTTrainerConfig, "rlcore-sft",
         lambda o: sft_config_errors(compose_sft(o)), None),
    Page("reward_model.md", "Reward-model trainer config", RMTrainerConfig, "rlcore-rm",
         lambda o: rm_config_errors(compose_rm(o)), None,
         "verl scores with reward models but has no trainer for them, so this trainer's keys are rlcore's own (they "
         "follow verl's SFT trainer's layout)"),
)


# --- the schema: leaves, types, defaults, comments ---------------------------------------------------------------

def walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, type, str]]:
    """(key, annotation, default, the class whose source declares the field, field name) of every leaf under the
    dataclass instance `node`, in declaration order (the order of key_status.schema_leaves)."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            yield from walk(value, f"{prefix}{f.name}.")
        else:
            # a subclass may inherit the field (SFTModelConfig from RMModelConfig): its comment is in the base's source
            owner = next(c for c in type(node).__mro__ if f.name in c.__dict__.get("__annotations__", {}))
            yield prefix + f.name, hints[f.name], value, owner, f.name


@lru_cache(maxsize=None)
def _source_index(path: str) -> tuple[dict, set, dict]:
    """A module's comments by line, the lines holding code, and each top-level class's field lines."""
    text = Path(path).read_text()
    comments, code_lines = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    fields = {node.name: {stmt.target.id: stmt.lineno for stmt in node.body
                          if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
              for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}
    return comments, code_lines, fields


def meaning(owner: type, name: str) -> str:
    """The field's trailing comment, else the comment lines directly above it, joined; "" without either."""
    comments, code_lines, fields = _source_index(inspect.getsourcefile(owner))
    line = fields[owner.__name__][name]
    if line in comments:
        return comments[line]
    above = []
    while line - 1 in comments and line - 1 not in code_lines:
        line -= 1
        above.insert(0, comments[line])
    return " ".join(above)


def type_text(hint: Any) -> str:
    if hint is Any:
        return "any"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union:
        return " | ".join(map(type_text, args)) + (" | None" if len(args) < len(typing.get_args(hint)) else "")
    if typing.get_origin(hint) is list:
        return f"list[{type_text(args[0])}]" if args else "list"
    if typing.get_origin(hint) is dict:
        return "dict"
    return hint.__name__


def literal(value: Any) -> str:
    """A value as it is written in YAML or on the command line (null, true, [0.9, 0.999])."""
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value)


INTERPOLATION = re.compile(r"\$\{(?:oc\.select:)?([^,}]+)(?:,[^}]*)?\}")


def default_text(value: Any, key: str) -> str:
    follows = INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
    if follows is None:
        return f"`{literal(value)}`"
    # a relative interpolation counts from the key's section: `.x` is a sibling, `..x` a sibling of the section
    target = follows.group(1)
    dots = len(target) - len(target.lstrip("."))
    if dots:
        base = key.split(".")[:-dots]
        target = ".".join([*base, target[dots:]])
    return f"follows `{target}`"


# --- statuses ----------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def load_verl(path: Path) -> dict[str, str]:
    """verl's keys with their defaults as written (`key=default` lines; `#` lines are comments)."""
    if not path.is_file():
        raise SystemExit(f"verl's key list is not at {path}: clone the repo with shared/ beside it")
    # `_target_` keys name verl's own config dataclasses (for its instantiate): no knob, in neither tree's comparison
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {key: value for key, value in pairs if key.rpartition(".")[2] != "_target_"}


def verl_versions(key: str) -> str:
    """Which of verl's trees have the key: "verl 0.8, 0.9", "verl 0.9", "verl 0.8" or ""."""
    found = [v for v, path in (("0.8", VERL_08_KEYS), ("0.9", VERL_KEYS)) if key in load_verl(path)]
    return f"verl {', '.join(found)}" if found else ""


def same_default(ours: Any, verl: str) -> bool:
    """Loosely: true/True, null/None, 1e-06/1e-6 and 0/0.0 are the same default."""
    try:
        return ours == json.loads(verl)
    except ValueError:  # a bare string (fsdp, ${...}, ???)
        return ours == verl


def refusals(page: Page, keys: list) -> dict[str, str]:
    """key -> its refused status: the value REFUSED lists, and the validator's message for the pattern's first key
    (as tests/config/test_key_status.py composes it), naming this key instead."""
    statuses = {}
    for pattern, (value, context) in REFUSED.items():
        matched = matching(pattern, keys)
        if not matched:
            continue
        first = matched[0]
        setting = [f"+{first}.{k}={v}" for k, v in value.items()] if isinstance(value, dict) else [f"{first}={value}"]
        said = [e for e in page.errors([*setting, *context]) if first in e]
        for key in matched:
            reason = said[0].replace(first, key) if said else "refused unless default; see rlcore-plan"
            statuses[key] = f"refused: e.g. `{literal(value)}`: {reason}"
    return statuses


def status(key: str, default: Any, note: str, verl: Optional[dict]) -> tuple[str, str]:
    """(family, cell) of a key that is neither refused nor without effect. With verl's lists, the lists decide (a
    verl key's comment may say "rlcore addition" of a value, as trainer.device's does of cpu): the 0.9 tree's default is
    compared, else the 0.8 tree's for a key 0.9 dropped; verl 0.8's name of a key 0.9 renamed reads as that key.
    Without, the comment."""
    if verl is None:
        if "rlcore addition" in note:
            return "rlcore only", "rlcore only"
        return "not compared", "not compared"
    new = renamed_from(key)
    if new:
        return "renamed", f"verl 0.8's name of `{new}` (verl 0.9): read as that key, with a note"
    versions = verl_versions(key)
    tree = verl if key in verl else load_verl(VERL_08_KEYS)
    if key in tree:
        dropped = "" if key in verl else "; verl 0.9 dropped it"
        if same_default(default, tree[key]):
            return "as in verl", f"as in {versions}{dropped}"
        return "as in verl", f"as in {versions}{dropped} (default differs: verl `{tree[key]}`)"
    tree = next((tree for tree, patterns in OTHER_VERL_TREES.items()
                 if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)), None)
    if tree:
        return "as in verl", f"as in verl ({tree}; default not compared)"
    return "rlcore only", "rlcore only"


@lru_cache(maxsize=None)
def rows(page: Page) -> tuple[Row, ...]:
    leaves = list(walk(page.schema()))
    verl = load_verl(page.verl_keys) if page.verl_keys else None
    refused = refusals(page, [key for key, *_ in leaves])
    out = []
    for key, hint, value, owner, name in leaves:
        note = meaning(owner, name)
        # a refused or no-effect key of verl's says which verl has it
        versions = f" ({verl_versions(key)})" if verl is not None and verl_versions(key) else ""
        if key in refused:
            family, said = "refused", refused[key] + versions
        elif no_effect_reason(key):
            family, said = "no effect", f"no effect: {no_effect_reason(key)}{versions}"
        elif page.verl_lacks:
            family, said = "rlcore only", "rlcore only"
        else:
            family, said = status(key, value, note, verl)
        out.append(Row(key, type_text(hint), default_text(value, key), note, family, said))
    return tuple(out)


def uncovered(verl: dict[str, str], leaves: dict[str, str]) -> list[str]:
    """verl's keys that no rlcore leaf covers; `leaves` maps rlcore's keys to their types. A dict-typed (or any)
    leaf (HF config overrides, engine kwargs) takes every key beneath it, as Hydra's `+key.sub=value` does."""
    containers = {key for key, kind in leaves.items() if kind in ("dict", "any")}
    sections = {".".join(key.split(".")[:n]) for key in leaves for n in range(1, key.count(".") + 1)}
    return [key for key in verl if key not in leaves and key not in sections  # a verl node rlcore has as a section
            and not any(".".join(key.split(".")[:n]) in containers for n in range(1, key.count(".") + 1))]


# --- the page ----------------------------------------------------------------------------------------------------

CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def cell(text: str) -> str:
    """One table cell: single-line; `|` escaped, and `<`, `>`, `*` outside code spans, so python-markdown's tables
    (MkDocs) keep the columns and render no stray tag or emphasis."""
    out, pos = [], 0
    text = " ".join(text.split())
    for span in CODE_SPAN.finditer(text):
        out.append(_escape(text[pos:span.start()]))
        # a pipe would end the cell on GitHub and show its escape inside code on MkDocs: such a span goes plain
        out.append(span.group(0) if "|" not in span.group(2) else _escape(span.group(2)))
        pos = span.end()
    return "".join(out) + _escape(text[pos:])


def _escape(text: str) -> str:
    return text.replace("|", r"\|").replace("*", r"\*").replace("<", "&lt;").replace(">", "&gt;")


def _table(header: tuple, lines: list) -> list[str]:
    """A markdown table of cells already escaped with cell()."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(line)} |" for line in lines), ""]


def _grouped(keys: list) -> dict[str, list]:
    """Keys by parent path, in the order of each group's first key (schema or file order: deterministic), a
    section before its subsections (fsdp_config's first key is its wrap policy's)."""
    groups: dict[str, list] = {}
    for key in keys:
        parts = key.split(".")[:-1]
        for n in range(len(parts) + 1):
            groups.setdefault(".".join(parts[:n]), [])
        groups[".".join(parts)].append(key)
    return {group: members for group, members in groups.items() if members}


def _section_doc(schema: type, group: str) -> str:
    """The first paragraph of the docstring of the dataclass behind a group ("" for dataclass's generated one)."""
    node = schema()
    for part in filter(None, group.split(".")):
        node = getattr(node, part)
    doc = type(node).__dict__.get("__doc__") or ""
    return "" if doc.startswith(type(node).__name__ + "(") else cell(inspect.cleandoc(doc).split("\n\n")[0])


def verl_trees(page: Page) -> dict[str, str]:
    """verl's keys of both trees (0.9's default where both have one)."""
    return {**load_verl(VERL_08_KEYS), **load_verl(page.verl_keys)}


def tally(page: Page) -> tuple[Counter, Optional[list]]:
    """Keys by status family, and verl's keys (0.8's or 0.9's) no rlcore key covers (None without a verl list)."""
    table = rows(page)
    missing = uncovered(verl_trees(page), {r.key: r.type for r in table}) if page.verl_keys else None
    return Counter(r.family for r in table), missing


def absent_status(key: str) -> str:
    """What rlcore does with a verl key its schema lacks: refused naming verl's feature, or as a misspelled key."""
    feature = verl_feature(key)
    if feature:
        return f"refused: verl's {feature[0]}: {feature[1]}"
    if not_a_verl_key(key):
        return f"refused: verl 0.9 refuses it too: {not_a_verl_key(key)}"
    return "refused as a misspelled key is, with the closest key named"


def summary(page: Page) -> str:
    by_family, missing = tally(page)
    told = ", ".join(f"{f} {by_family[f]}" for f in FAMILIES if f != "not compared" or by_family[f])
    extra = f"verl keys not in rlcore {len(missing)}" if missing is not None else "no verl key list to compare"
    return f"{page.file}: {sum(by_family.values())} keys: {told}; {extra}"


def _intro(page: Page) -> list[str]:
    source = Path(inspect.getsourcefile(page.schema)).relative_to(REPO_ROOT)
    verl = (f"verl's keys and defaults are those of verl 0.9's tree, `shared/reference/{page.verl_keys.name}`, and of "
            f"verl 0.8's for the keys 0.9 dropped, `shared/reference/{VERL_08_KEYS.name}` (beside the repository); each "
            "verl key says which versions have it"
            if page.verl_keys else page.verl_lacks if page.verl_lacks else "rlcore holds no list of verl's keys for this trainer (`shared/reference` has the "
            "PPO trainer's), so the others are not compared with verl's")
    return [
        f"# {page.title}", "", f"<!-- generated by `{COMMAND}`: do not edit by hand -->", "",
        f"Every key of `{page.entry}`'s config, generated from its schema dataclasses (`{page.schema.__name__}` in "
        f"`{source}`), the one source of truth: type and default from each field, meaning from the field's "
        f"comment. **Do not edit this page by hand**: change the schema (or `rlcore/config/key_status.py`) and run "
        f"`{COMMAND}`; `tests/cli/test_config_reference.py` fails while a page is stale.", "",
        f"A key's status is the first of these that applies; {verl}:", "",
        "- **refused**: validation stops the run before Ray starts if it is set to anything but its default "
        "(`REFUSED` in `rlcore/config/key_status.py`); the validator's message is quoted;",
        "- **no effect**: accepted so that verl command lines compose; set to anything but its default, it is "
        "reported with the reason at the start of the run and by `rlcore-plan` (`NO_EFFECT`);",
        *(["- **renamed**: verl 0.8's name of a key verl 0.9 renamed (`rlcore/config/renamed.py`): its value is read "
           "as the 0.9 key's, with a one-line note naming that key; both set to different values is refused;",
           "- **rlcore only**: verl has no such key;",
           "- **as in verl**: verl's key; where rlcore's default differs, verl's is given."] if page.verl_keys else
          ["- **rlcore only**: any other key."] if page.verl_lacks else
          ["- **rlcore only**: its comment says rlcore addition;",
           "- **not compared**: any other key."]), "",
    ]


def render(page: Page) -> str:
    table, (by_family, missing) = rows(page), tally(page)
    lines = _intro(page) + ["## Counts", ""] + _table(("status", "keys"), [
        *((f, str(by_family[f])) for f in FAMILIES if by_family[f]), ("total", str(len(table))),
        *([("verl keys not in rlcore", str(len(missing)))] if missing is not None else [])])
    by_key = {r.key: r for r in table}
    for group, keys in _grouped(list(by_key)).items():
        doc = _section_doc(page.schema, group)
        lines += [f"## `{group}`" if group else "## top level", "", *([doc, ""] if doc else [])]
        lines += _table(("key", "type", "default", "meaning", "status"), [
            (f"**{cell(r.key.rpartition('.')[2])}** `{r.key}`", *map(cell, (r.type, r.default, r.meaning, r.status)))
            for r in map(by_key.get, keys)])
    if missing is not None:
        verl = verl_trees(page)
        lines += ["## verl keys not in rlcore", "",
                  f"{len(missing)} keys of verl's trees (0.8's and 0.9's) that no rlcore key covers (a dict-typed rlcore "
                  "key, such as the HF config overrides, covers the keys beneath it), by section, with verl's default, "
                  "which versions have it, and what composing it does: refused before anything runs, with verl's "
                  "feature and why rlcore lacks it where it is one of verl's features.", ""]
        for group, keys in _grouped(missing).items():
            lines += [f"### `{group}`", ""] + _table(("verl key", "verl default", "in", "rlcore"), [
                (cell(f"`{k}`"), cell(f"`{verl[k]}`"), cell(verl_versions(k)), cell(absent_status(k))) for k in keys])
    return "\n".join(lines).rstrip("\n") + "\n"


def stale(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """The pages under docs_dir that are missing or differ from what the schemas generate now."""
    return [docs_dir / p.file for p in PAGES
            if not (docs_dir / p.file).is_file() or (docs_dir / p.file).read_text() != render(p)]


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from what would be generated")
    if parser.parse_args(argv).check:
        old = [str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p) for p in stale(DOCS_DIR)]
        if old:
            print(f"stale config reference: {', '.join(old)} (the schemas or key_status.py changed since they were "
                  f"generated); run `{COMMAND}`", file=sys.stderr)
        return int(bool(old))
    DOCS_DIR.mkdir(parents=True, exist_ok=True)
    for page in PAGES:
        (DOCS_DIR / page.file).write_text(render(page))
        print(summary(page))
    return 0


if __name__ == "__main__":
    sys.exit(main())
