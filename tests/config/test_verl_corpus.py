"""verl's own example scripts, as a user pastes them: the doctor accepts each, or refuses it only for the reasons
listed in the corpus's EXPECTED.txt. Two corpora: verl 0.8's examples (tests/config/verl_corpus, b178a3c) and verl
0.9's (tests/config/verl_0_9_corpus, 1dda039): rlcore speaks both dialects.

Each corpus (<corpus>/*.args) is every launch script under verl's examples/ at that commit, run by
tools/verl_corpus.py with bash expanding its variables and every program stubbed (a GPU machine's branch of the
scripts' device `case` blocks): one file per script, its verl entry point and its overrides. Each is planned as
`rlcore-plan --elsewhere` would (models, data and tools are on the user's machine, not here), every problem at once;
its verdict is `accepted` or the sorted set of reasons, one per refused feature. A change to what the doctor accepts
shows up as a changed line here: an improvement is recorded by updating EXPECTED.txt (the message says how), a
regression fails.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import re
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CORPUS = HERE / "verl_corpus"  # verl 0.8's
# verl version -> (its corpus, how many of its example scripts there are)
CORPORA = {"0.8": (CORPUS, 139), "0.9": (HERE / "verl_0_9_corpus", 109)}
UPDATED = Path(__file__).resolve().parents[2] / ".cache"
# verl's entry point -> rlcore's config of the same trainer (main_ppo_sync: verl 0.8's name of the trainer 0.9 folded
# into main_ppo; fully_async_main: verl's fully-async recipe, rlcore's split pools under the same keys)
ENTRIES = {"verl.trainer.main_ppo": "ppo_trainer", "verl.trainer.fsdp_sft_trainer": "sft_trainer",
           "verl.trainer.sft_trainer": "sft_trainer", "verl.trainer.main_ppo_sync": "ppo_trainer",
           "verl.experimental.fully_async_policy.fully_async_main": "ppo_trainer"}
# verl's config names that rlcore's configs stand for (verl's fully-async recipe builds on its PPO trainers' trees)
CONFIG_NAMES = {"fully_async_ppo_trainer": "ppo_trainer", "fully_async_ppo_megatron_trainer": "ppo_megatron_trainer"}
# error text -> the reason it counts under (first match); any other error counts under its own first clause
REASONS = (
    (r"is verl's (.+?); not supported by rlcore", None),
    (r"sglang", "SGLang rollout"),
    (r"trtllm|TensorRT", "TensorRT-LLM rollout"),
    (r"multimodal|vision", "vision-language model"),
    (r"\bnpu\b", "Ascend NPU"),
    (r"^([\w.+~]+) is not a config key in verl 0.9 either", "{0}: verl 0.9 refuses the key too"),
    (r"^([\w.+~]+) is not a config key", "unknown key {0}"),
    (r"^Error merging override ([\w.]+)=:", "{0} from the user's environment (empty here)"),
    (r"^Error parsing override '([\w.]+)=", "{0}: the script's own override does not parse (a typo in verl's script)"),
)


def read(path: Path) -> tuple[str, str, list[str]]:
    lines = path.read_text().splitlines()
    return lines[0][2:], lines[1].removeprefix("# entry: "), [line for line in lines[2:] if line]


def reason(error: str) -> str:
    for pattern, name in REASONS:
        found = re.search(pattern, error, re.I)
        if found:
            return name.format(*found.groups()) if name else f"verl's {found.group(1)}"
    return re.split(r"[;:(]", error, maxsplit=1)[0].strip()


def doctor_errors(entry: str, args: list[str], corpus: Path = CORPUS) -> list[str]:
    """What `rlcore-plan --elsewhere` reports as errors for the script's overrides."""
    from rlcore.cli.overrides import ComposeError, compose_explained, schema_keys, set_existing_keys, split_argv
    from rlcore.cli.plan import composer

    # `--config-path=config` is verl's own config directory (next to its main_ppo), whose names rlcore's configs share;
    # another is an example's folder, copied under configs/ (tools/verl_corpus.py) and composed onto rlcore's configs
    from rlcore.config import external_config_dir

    paths = [a.split("=", 1)[-1] for a in args if a.startswith("--config-path")]
    config_dir = str(corpus / "configs" / paths[0].strip("/")) if paths and external_config_dir(paths[0]) else None
    args = [a for a in args if not a.startswith("--config-path")]
    named = [_config_name(a) if a.startswith("--config-name") or b in ("--config-name", "-cn") else a
             for b, a in zip(["", *args], args)]
    config_name, overrides, _, _ = split_argv(named, ENTRIES[entry])
    compose_fn, check = composer(config_name, config_dir)
    overrides = set_existing_keys(overrides, schema_keys(config_name))  # as rlcore-train and rlcore-plan do
    try:
        return check(compose_explained(compose_fn, overrides), "elsewhere").errors
    except ComposeError as err:
        return err.problems + (check(err.partial, "elsewhere").errors if err.partial is not None else [])


def _config_name(arg: str) -> str:
    """verl's scripts name the config with or without .yaml, and verl's fully-async recipe's own trees."""
    flag, eq, name = arg.rpartition("=") if arg.startswith("--config-name=") else ("", "", arg)
    name = name.removesuffix(".yaml")
    return f"{flag}{eq}{CONFIG_NAMES.get(name, name)}"


def script_verdict(job: tuple[Path, Path]) -> tuple[str, str]:
    corpus, path = job
    script, entry, args = read(path)
    if entry not in ENTRIES:
        return script, f"verl's entry point {entry}"
    return script, "; ".join(sorted({reason(e) for e in doctor_errors(entry, args, corpus)})) or "accepted"


@pytest.fixture(scope="module")
def verdicts() -> dict[Path, dict[str, str]]:
    """Every corpus's verdicts, by corpus, over two fresh processes shared by both corpora: a script's verdict is
    ~0.5 s of Hydra composing in pure Python on one core, and a process's imports and first composition ~7 s (one
    pool per corpus paid that twice). Nothing else runs beside this test."""
    context = multiprocessing.get_context("spawn")  # not fork: the pytest process may hold Ray's threads
    jobs = [(corpus, p) for corpus, _ in CORPORA.values() for p in sorted(corpus.glob("*.args"))]
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        found = list(pool.map(script_verdict, jobs, chunksize=8))
    return {corpus: {script: verdict for (of, _), (script, verdict) in zip(jobs, found) if of == corpus} for corpus, _ in CORPORA.values()}


@pytest.mark.parametrize("version", list(CORPORA))
def test_the_corpus_is_verls_examples(version):
    corpus, count = CORPORA[version]
    scripts = [read(p)[0] for p in corpus.glob("*.args")]
    assert len(scripts) == count and all(s.startswith("examples/") and s.endswith(".sh") for s in scripts)


@pytest.mark.parametrize("version", list(CORPORA))
def test_each_script_is_accepted_or_refused_only_for_its_listed_reasons(version, verdicts, capsys):
    corpus, _ = CORPORA[version]
    found = verdicts[corpus]
    counts = Counter("accepted" if v == "accepted" else "refused" for v in found.values())
    by_reason = Counter(r for v in found.values() if v != "accepted" for r in v.split("; "))
    with capsys.disabled():
        print(f"\nverl {version} corpus: {counts['accepted']} of {len(found)} scripts accepted; reasons (scripts): "
              + ", ".join(f"{r} ({n})" for r, n in by_reason.most_common()))
    expected_file = corpus / "EXPECTED.txt"
    expected = dict(line.split("\t", 1) for line in expected_file.read_text().splitlines() if line)
    changed = {s: (expected.get(s), v) for s, v in found.items() if expected.get(s) != v}
    updated = UPDATED / f"{corpus.name}_EXPECTED.txt"
    if changed:
        updated.parent.mkdir(exist_ok=True)
        updated.write_text("".join(f"{s}\t{v}\n" for s, v in found.items()))
    assert not changed, (f"{len(changed)} script(s) changed verdict (was -> now):\n"
                         + "\n".join(f"  {s}: {a} -> {b}" for s, (a, b) in sorted(changed.items()))
                         + f"\nif each is intended: cp {updated} {expected_file}")


@pytest.mark.parametrize("error, expected", [
    ("actor_rollout_ref.model.mtp.enable is verl's multi-token prediction (MTP) training; not supported by rlcore: ...",
     "verl's multi-token prediction (MTP) training"),
    ("data.bogus is not a config key; did you mean data.shuffle?", "unknown key data.bogus"),
    ("actor_rollout_ref.rollout.name=sglang is not supported yet by rlcore; use ...", "SGLang rollout"),
])
def test_errors_count_under_their_feature(error, expected):
    assert reason(error) == expected


# verl's scripts for the newer families, with the model directory present: the family is checked from its config.json
# (the published shape's keys from rlcore's table, written as the checkpoint's own), as a user's machine would.
# -> the family refusals each script still gets (the script's other verdicts are EXPECTED.txt's)
STAND_INS = {
    "ppo_trainer__run_gemma.args": ("gemma-2-2b", []),
    "grpo_trainer__run_mistral13b_skyworkrm_hhrlhf.args": ("mistral-nemo-12b", []),
    "grpo_trainer__run_seed_oss_36b.args": ("seed-oss-36b", []),
    "grpo_trainer__run_gptoss_20b.args": ("gpt-oss-20b", []),
    "grpo_trainer__run_moonlight16b_math_megatron.args": ("moonlight-16b-a3b", []),  # megatron-core's MLA at TP4 x PP3 x EP4
    "grpo_trainer__run_deepseek671b_math_megatron_96gb.args": ("deepseek-v3", []),
}


@pytest.mark.parametrize("script", list(STAND_INS))
def test_the_newer_families_scripts_are_checked_against_their_models_config(script, tmp_path):
    import json

    from rlcore.plan.arch import BUILTIN, hf_config

    entry_shape, refusals = STAND_INS[script]
    model = tmp_path / entry_shape
    model.mkdir()
    (model / "config.json").write_text(json.dumps(hf_config(BUILTIN[entry_shape])))
    _, entry, args = read(CORPUS / script)
    keys = ("actor_rollout_ref.model.path=", "critic.model.path=")
    args = [f"{a.split('=', 1)[0]}={model}" if a.startswith(keys) else a for a in args]
    found = doctor_errors(entry, args)
    errors = [e for e in found if str(model) in e]
    assert len(errors) == len(refusals) and all(r in e for r, e in zip(refusals, errors)), errors
    expected = dict(line.split("\t", 1) for line in (CORPUS / "EXPECTED.txt").read_text().splitlines() if line)
    others = sorted({reason(e) for e in found if str(model) not in e})
    assert ("; ".join(others) or "accepted") == expected[read(CORPUS / script)[0]]
