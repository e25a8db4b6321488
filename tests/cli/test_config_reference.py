"""The config reference pages (docs/reference/*.md) are what rlcore/cli/config_reference.py generates from the schemas
now, every field has a meaning, and each row says what the schema, key_status.py and verl's key list say."""

from __future__ import annotations

import shutil
from collections import Counter
from html.parser import HTMLParser

import pytest

from rlcore.cli import config_reference as reference
from rlcore.cli.config_reference import COMMAND, PAGES, VERL_KEYS, meaning, render, rows, uncovered, walk
from rlcore.config.key_status import schema_leaves

PPO, SFT, RM = PAGES
needs_verl = pytest.mark.skipif(not VERL_KEYS.is_file(), reason=f"verl key reference not present at {VERL_KEYS}")


def _needs_list(page):
    return pytest.param(page, id=page.file, marks=[needs_verl] if page.verl_keys else [])


def _row(page, key):
    return next(r for r in rows(page) if r.key == key)


@pytest.mark.parametrize("page", [_needs_list(p) for p in PAGES])
def test_page_is_what_the_schemas_generate_now(page):
    path = reference.DOCS_DIR / page.file
    assert path.is_file() and path.read_text() == render(page), (
        f"{path.relative_to(reference.REPO_ROOT)} differs from what the schemas generate now (a field, its comment or "
        f"default, or key_status.py changed): run `{COMMAND}` and commit the page")


def test_every_field_has_a_meaning():
    bare = [f"{page.file}: {key} ({owner.__name__} in {owner.__module__})"
            for page in PAGES for key, _, _, owner, name in walk(page.schema()) if not meaning(owner, name)]
    assert not bare, ("schema fields without a comment (a trailing `# ...` on the field's line, or comment lines "
                      "directly above it) say what the key means on the reference page:\n" + "\n".join(bare))


@needs_verl
def test_a_row_has_the_fields_type_default_meaning_and_status():
    lr = _row(PPO, "actor_rollout_ref.actor.optim.lr")
    assert (lr.type, lr.default, lr.meaning, lr.status) == ("float", "`1e-06`", "peak learning rate", "as in verl 0.8, 0.9")
    # the default the trainer's root builds (critic's OptimConfig(lr=1e-5)), not the dataclass's own
    assert _row(PPO, "critic.optim.lr").default == "`1e-05`"
    low = _row(PPO, "actor_rollout_ref.actor.clip_ratio_low")
    assert low.default == "follows `actor_rollout_ref.actor.clip_ratio`"  # a relative interpolation, resolved
    assert low.status == "as in verl 0.8, 0.9 (default differs: verl `0.2`)"
    assert _row(PPO, "reward.reward_model.rollout.name").default == "`null`"  # verl's ??? (mandatory): nothing reads it here
    # each dialect: a key new in 0.9, one 0.9 dropped, 0.8's name of a renamed one
    assert _row(PPO, "trainer.v1.trainer_mode").status == "as in verl 0.9"
    assert _row(PPO, "trainer.use_legacy_worker_impl").status == "as in verl 0.8; verl 0.9 dropped it"
    assert _row(PPO, "reward_model.reward_manager").family == "renamed"
    assert _row(PPO, "reward_model.reward_manager").status.startswith("verl 0.8's name of `reward.reward_manager.name`")
    text = render(PPO)
    listed = text[text.index("## verl keys not in rlcore"):]
    assert "| `transfer_queue.enable` | `false` | verl 0.8, 0.9 | refused: verl's transfer queue: not in rlcore" in listed
    tokenizer = _row(PPO, "data.tokenizer")
    assert tokenizer.type == "str | None" and tokenizer.status.startswith("no effect: rlcore tokenizes the prompts")
    refused = _row(PPO, "critic.optim.optimizer")
    assert refused.status.startswith("refused: e.g. `SGD`: critic.optim.optimizer=SGD: ")  # the validator's message
    assert _row(PPO, "trainer.seed").status == "rlcore only"
    assert _row(PPO, "trainer.logger").meaning.startswith("trackers: console|file|jsonl")  # comment lines above
    # an inherited field's comment is read from the base class's module (SFTModelConfig from RMModelConfig)
    assert _row(SFT, "model.lora_rank").meaning == "LoRA rank; 0 = full fine-tuning (the head always trains whole)"
    assert _row(SFT, "model.path").default == "follows `model.partial_pretrain`"


@pytest.mark.parametrize("page", [_needs_list(p) for p in PAGES])
def test_counts_add_up_to_the_schemas_leaves(page):
    leaves = list(schema_leaves(page.schema))
    assert [r.key for r in rows(page)] == leaves
    by_family = Counter(r.family for r in rows(page))
    assert set(by_family) <= set(reference.FAMILIES) and sum(by_family.values()) == len(leaves)
    text = render(page)
    assert f"| total | {len(leaves)} |" in text
    for family, count in by_family.items():
        assert f"| {family} | {count} |" in text


def test_verl_keys_under_a_dict_key_are_covered_and_others_listed():
    verl = {"a.x": "1", "a.override_config.k": "2", "a.gone": "3", "b.c.d": "4"}
    assert uncovered(verl, {"a.x": "int", "a.override_config": "dict", "b.c": "int"}) == ["a.gone", "b.c.d"]


@needs_verl
def test_a_verl_key_absent_from_rlcore_is_listed_with_its_default():
    text = render(PPO)
    listed = text[text.index("## verl keys not in rlcore"):]
    assert "| `actor_rollout_ref.model.mtp.enable` | `false` |" in listed
    assert "`actor_rollout_ref.model.override_config`" not in listed  # rlcore has it
    assert "### `actor_rollout_ref.model.mtp`" in listed  # grouped by parent


@needs_verl
def test_check_names_the_stale_page_and_the_command(tmp_path, monkeypatch, capsys):
    for page in PAGES:
        shutil.copy(reference.DOCS_DIR / page.file, tmp_path / page.file)
    monkeypatch.setattr(reference, "DOCS_DIR", tmp_path)
    assert reference.main(["--check"]) == 0
    (tmp_path / SFT.file).write_text((tmp_path / SFT.file).read_text().replace("held-out rows", "held out"))
    assert reference.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / SFT.file) in err and COMMAND in err and PPO.file not in err


class _Cells(HTMLParser):
    """The text of each table row's cells, and every tag, of python-markdown's HTML."""

    def __init__(self):
        super().__init__()
        self.rows, self.tags, self.in_cell = [], set(), False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self.rows[-1].append("")
            self.in_cell = True

    def handle_endtag(self, tag):
        self.in_cell = self.in_cell and tag != "td"

    def handle_data(self, data):
        if self.in_cell:
            self.rows[-1][-1] += data


@pytest.mark.parametrize("page", [_needs_list(p) for p in PAGES])
def test_page_renders_as_mkdocs_renders_it(page):
    markdown = pytest.importorskip("markdown")  # MkDocs' renderer (the docs extra)
    html = _Cells()
    html.feed(markdown.markdown(render(page), extensions=["tables"]))
    # python-markdown pads or drops cells to the header's width, so a stray | shows as text in the wrong column
    plain = lambda text: " ".join(text.replace("`", "").split())  # noqa: E731  (what the reader sees)
    shown = {cells[0].rpartition(" ")[2]: cells for cells in html.rows if len(cells) == 5}
    assert len(shown) == len(rows(page))
    assert all(shown[r.key][0] == f"{r.key.rpartition('.')[2]} {r.key}" for r in rows(page))
    assert {key: (cells[3], cells[4]) for key, cells in shown.items()} == {
        r.key: (plain(r.meaning), plain(r.status)) for r in rows(page)}
    assert html.tags <= {"h1", "h2", "h3", "p", "ul", "li", "strong", "code", "table", "thead", "tbody", "tr", "th",
                         "td"}, "a < or > in the text became a tag"
