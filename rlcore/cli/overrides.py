"""Composing a command line's overrides the way Hydra will, with mistakes explained in one line.

Both doors use it: `rlcore-plan` composes every job of a sweep with it, and `rlcore-train` runs it before handing
the command line to Hydra, so a misspelled key or recipe gets "did you mean" (Hydra's own hint for a misspelled key
is to prepend `+`, which the validator then refuses: rlcore/config/keys.py).
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Callable

from omegaconf import DictConfig

# verl 0.9's SFT engines rlcore's SFT trainer does not have (engine=<name>, optim=<name>)
SFT_ENGINES = {"megatron": "Megatron", "automodel": "NeMo AutoModel", "veomni": "VeOmni", "torchtitan": "TorchTitan",
               "mlite": "Megatron-Lite"}
HYDRA_FLAGS_WITH_VALUE = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")
SWEEP_FLAGS = ("-m", "--multirun")


class ComposeError(ValueError):
    """A command line that does not compose: each problem one line with its fix (all of them, not the first only),
    and the config composed without the overrides that failed (None when that does not compose either), so the
    doctor can check the rest in the same run."""

    def __init__(self, problems: list[str], partial: DictConfig | None = None):
        self.problems, self.partial = problems, partial
        text = problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        super().__init__(text)


def expand_sweep(overrides: list[str], basic: bool = True) -> list[list[str]]:
    """Every job of a basic sweep (`a=1,2 b=x,y` -> four override lists), in Hydra's order. With another sweeper
    (`hydra/sweeper=optuna`: its jobs are chosen at run time) one job of the overrides that are not sweeps."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if not basic:
            return [[o.input_line for o in parsed if not o.is_sweep_override()]]
        return BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
    except HydraException as err:
        raise ComposeError([_one_line(str(err))]) from None


def schema_keys(config_name: str) -> set[str]:
    """Every leaf key of the schema a config name composes onto (rm_* and sft_* have their trainers')."""
    from rlcore.config.key_status import schema_leaves
    from rlcore.config.rm_schema import RMTrainerConfig
    from rlcore.config.schema import PPOConfig
    from rlcore.config.sft_schema import SFTTrainerConfig

    schema = RMTrainerConfig if config_name.startswith("rm_") else SFTTrainerConfig if config_name.startswith("sft_") else PPOConfig
    return set(schema_leaves(schema))


def set_existing_keys(overrides: list[str], leaves: set[str]) -> list[str]:
    """verl's scripts add with `+` keys that verl's tree lacks and rlcore's schema has (`+data.gen_batch_size`,
    `+actor_rollout_ref.actor.fsdp_config.model_dtype`); Hydra refuses `+` on a key that exists ("An item is already
    at ..."), so on a schema key it sets the key instead. A `+` on any other key stays: a free-form section's new key."""
    return [o[1:] if o.startswith("+") and not o.startswith("++") and o[1:].split("=", 1)[0] in leaves else o
            for o in overrides]


def varying(jobs: list[list[str]]) -> list[list[str]]:
    """Each job's overrides that differ between jobs (what a summary row needs to show)."""
    if len(jobs) < 2:
        return jobs
    common = set(jobs[0]).intersection(*jobs[1:])
    return [[o for o in job if o not in common] for job in jobs]


MAX_PROBLEMS = 64


def compose_explained(compose: Callable[[list[str]], DictConfig], overrides: list[str]) -> DictConfig:
    """compose(overrides), or ComposeError with every refusal, each turned into one line naming the fix.

    Hydra stops at the first override it refuses; a verl script pasted as it is often has several (keys rlcore lacks,
    a value of the wrong type), and fixing them one run at a time is what users give up on. So the override Hydra
    names is left out and the rest composed again, until the rest composes or a refusal names no override."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    problems, rest = [], list(overrides)
    key_tree = functools.cache(lambda: _key_tree(compose, overrides))  # composed once, for every refused key's suggestion
    while len(problems) < MAX_PROBLEMS:
        try:
            cfg = compose(rest)
        except (HydraException, OmegaConfBaseException) as err:
            message = str(err)
            if message.startswith("Error merging override") and err.__cause__ is not None:
                # Hydra's own line drops why (a string where a number or a list is wanted, ...): the cause says it
                message += f": {str(err.__cause__).splitlines()[0]}"
            problems.append(explain(message, key_tree))
            culprit = _refused_override(message, rest)
            if culprit is None:
                raise ComposeError(problems) from None
            rest.remove(culprit)
            continue
        if problems:
            raise ComposeError(problems, cfg)
        return cfg
    raise ComposeError(problems)


def _refused_override(message: str, overrides: list[str]) -> str | None:
    """The override a Hydra refusal is about: named whole ("Error merging override a.b=1"), by its key ("Could not
    override 'a.b'", "full_key: a.b"), or as a group's option ("Could not find 'recipe/x'")."""
    merging = re.match(r"Error merging override (.+?)(?::|$)", message.splitlines()[0])
    if merging and merging.group(1) in overrides:
        return merging.group(1)
    by_key = re.search(r"Could not (?:override|append to|delete from) '([^']+)'|full_key: (\S+)", message)
    option = re.search(r"Could not find '([^']+)/([^']+)'", message)
    for override in overrides:
        key, _, value = override.partition("=")
        if by_key and key.lstrip("+~") == (by_key.group(1) or by_key.group(2)):
            return override
        if option and (key, value) == option.groups():
            return override
    ambiguous = re.search(r"Ambiguous value for argument '([^']+)'", message)
    return ambiguous.group(1) if ambiguous and ambiguous.group(1) in overrides else None


def _key_tree(compose, overrides: list[str]) -> DictConfig | None:
    """The config the user meant to change (their recipe and groups only), for suggesting keys."""
    groups = [o for o in overrides if re.match(r"^[\w/]+=", o) and "." not in o.split("=")[0] and not o.startswith("+")]
    for attempt in (groups, []):
        try:
            return compose(attempt)
        except Exception:  # noqa: BLE001 - any failure: try with fewer overrides
            continue
    return None


def explain(message: str, key_tree: Callable[[], DictConfig | None]) -> str:
    """One line for Hydra's message: a missing group option names the closest option and lists them all, a refused
    key names the closest schema key, a `~` value says how to write it, a comma list says to add -m."""
    from rlcore.config.keys import explain_compose_error

    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", message)
    if missing and "Available options in" in message:
        group, name = missing.groups()
        listing = message.split("Available options in", 1)[1].split("Config search path", 1)[0]
        options = [line.strip() for line in listing.splitlines()[1:] if line.strip()]
        if group in ("engine", "optim") and name in SFT_ENGINES:  # verl's SFT trainer's other engines
            return f"{group}={name} is verl's {SFT_ENGINES[name]} SFT engine; rlcore's SFT trainer trains with FSDP2: use {group}=fsdp"
        close = difflib.get_close_matches(name, options, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return f"{group}={name} is not one of the {group} options; {hint}available: {', '.join(options)}"
    tilde = re.search(r"([\w.]+)=(~[^\s]*)", message)
    if "LexerNoViableAltException" in message and tilde:
        key, value = tilde.groups()
        return (f"{key}={value}: Hydra's override grammar refuses an unquoted ~ in a value; write {key}=$HOME{value[1:]} "
                f"(the shell expands it) or quote it: '{key}=\"{value}\"'")
    if "No match in the defaults list" in message:
        key = re.search(r"Could not override '([^']+)'", message)
        name = key.group(1) if key else "that group"
        return f"{name} is not a config group here; groups: recipe, data, model, actor, ref, rollout, critic, reward_model"
    unknown = any(s in message for s in ("not in struct", "Could not override", "ConfigKeyError"))  # an override's or a YAML's key
    return explain_compose_error(message, key_tree() if unknown else None)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def config_dir_of(argv: list[str]) -> str | None:
    """The `--config-path` (`-cp`) of a command line when it names a verl example's config folder (its absolute
    path); None for none, or for verl's own trainer folder, whose config names rlcore's share."""
    from rlcore.config import external_config_dir

    for previous, arg in zip(["", *argv], argv):
        if arg.startswith("--config-path="):
            return external_config_dir(arg.split("=", 1)[1])
        if previous in ("--config-path", "-cp"):
            return external_config_dir(arg)
    return None


def hydra_argv(argv: list[str]) -> list[str]:
    """The command line as rlcore's `@hydra.main` takes it: verl's own `--config-path=config` dropped (rlcore's
    config folder has those names), a verl example's folder made absolute with rlcore's folder on its search path."""
    from rlcore.config import searchpath_override

    config_dir, out, skip = config_dir_of(argv), [], False
    for previous, arg in zip(["", *argv], argv):
        if skip:
            skip = False
            continue
        if arg in ("--config-path", "-cp") or arg.startswith("--config-path="):
            skip = arg in ("--config-path", "-cp")
            if config_dir is not None:
                out.append(f"--config-path={config_dir}")
            continue
        out.append(arg)
    return out + ([searchpath_override()] if config_dir is not None else [])


def split_argv(argv: list[str], default_config: str) -> tuple[str, list[str], bool | str, bool]:
    """(config name, overrides, sweep, plain) of a Hydra command line. sweep: False, True (-m, basic sweeper) or
    "other" (another sweeper chosen); plain is False when it asks Hydra for something else than a run (--help,
    --cfg, --info, ...), which the pre-check then leaves alone."""
    config_name, overrides, sweep, plain, args = default_config, [], False, True, iter(argv)
    for arg in args:
        if arg.startswith("hydra/sweeper=") and arg != "hydra/sweeper=basic":
            sweep = "other"  # a sweeper that picks its jobs itself: check the fixed overrides only
        if arg in SWEEP_FLAGS:
            sweep = sweep or True
        elif arg in HYDRA_FLAGS_WITH_VALUE:
            value = next(args, "")
            if arg in ("--config-name", "-cn"):
                config_name = value
            elif arg in ("--config-dir", "-cd"):
                plain = False  # a further config directory: Hydra's business
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        elif arg.startswith("--config-path="):
            continue  # rlcore's own folder, or a verl example's (config_dir_of): composed here all the same
        elif arg.startswith("-"):
            plain = False
        elif not arg.startswith(("hydra.", "hydra/", "+hydra", "~hydra")):
            overrides.append(arg)
    return config_name, overrides, sweep, plain
