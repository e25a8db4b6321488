"""`rlcore-plan [--config-name NAME] key=value ...`: the config doctor.

Composes the config exactly as `rlcore-train` would (same overrides, recipes, `+key=value`), then prints every
violation at once with its fix, the batch plan and the per-device memory plan with a verdict per role. A config
named rm_* or sft_* is composed as `rlcore-rm` / `rlcore-sft` would, and planned as that one training role. Nothing
is loaded and neither torch nor ray is imported (unless trainer.device=cuda asks to measure the local GPU), so it
answers in about a second for any model in the built-in table, on any machine. Exit status: 0 when the config is
valid and every role fits or is tight, 1 otherwise.

`--rehearse` then checks the plan against the real engine code: the FSDP2 engines are built and one step's phases
run on fake tensors over a fake world of the config's size (rlcore.cli.rehearsal; about a minute for a 7B model
on 2 CPU cores, no memory beyond a few hundred MB), printing each phase's peak per rank beside the plan; it fails
when a phase does not fit.
"""

from __future__ import annotations

import sys

from rlcore.config import compose, format_plan
from rlcore.config.validate import diagnose
from rlcore.plan import format_memory, memory_plan, supervised_memory_plan

USAGE = "usage: rlcore-plan [--config-name ppo_trainer|ppo_megatron_trainer|rm_trainer|sft_trainer|...] [--rehearse] [recipe=NAME] [key=value ...]"


def parse_args(argv: list[str]) -> tuple[str, list[str], bool]:
    config_name, overrides, rehearse, args = "ppo_trainer", [], False, iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            raise SystemExit(f"{USAGE}\n\n{__doc__}")
        if arg == "--rehearse":
            rehearse = True
            continue
        if arg == "--config-name":
            config_name = next(args, None) or sys.exit(f"rlcore-plan: --config-name needs a value\n{USAGE}")
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise SystemExit(f"rlcore-plan: unknown option {arg}\n{USAGE}")
        else:
            overrides.append(arg)
    return config_name, overrides, rehearse


def doctor(cfg) -> tuple[str, bool]:
    """The report for a composed config and whether it passes (no violation, no role out of memory)."""
    plan, errors = diagnose(cfg)
    mem = memory_plan(cfg, plan)
    errors = errors + mem.errors
    lines = [f"{len(errors)} config error(s):"] + [f"  {i}. {e}" for i, e in enumerate(errors, 1)] if errors else []
    if plan is not None:
        lines.append(format_plan(plan))
    lines.append(format_memory(mem))
    return "\n".join(lines), not errors and mem.ok


def supervised_doctor(cfg, pairs: bool) -> tuple[str, bool]:
    """The report of an rlcore-rm (`pairs`) or rlcore-sft config: its rule violations and its memory plan."""
    from rlcore.config.rm_schema import rm_config_errors
    from rlcore.train_sft import sft_config_errors

    mem = supervised_memory_plan(cfg, pairs)
    errors = (rm_config_errors(cfg) if pairs else sft_config_errors(cfg)) + mem.errors
    lines = [f"{len(errors)} config error(s):"] + [f"  {i}. {e}" for i, e in enumerate(errors, 1)] if errors else []
    lines.append(format_memory(mem))
    return "\n".join(lines), not errors and mem.ok


def compose_any(config_name: str, overrides: list[str]):
    """(config, its doctor): rm_* and sft_* names are composed with their trainers' schemas."""
    if config_name.startswith("rm_"):
        from rlcore.train_rm import compose_rm

        return compose_rm(overrides, config_name), lambda cfg: supervised_doctor(cfg, pairs=True)
    if config_name.startswith("sft_"):
        from rlcore.train_sft import compose_sft

        return compose_sft(overrides, config_name), lambda cfg: supervised_doctor(cfg, pairs=False)
    return compose(overrides, config_name=config_name), doctor


def main(argv: list[str] | None = None) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_name, overrides, rehearse = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg, check = compose_any(config_name, overrides)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"rlcore-plan: the config does not compose: {err}", file=sys.stderr)
        return 1
    report, ok = check(cfg)
    print(report, flush=True)
    if rehearse:
        if check is not doctor:
            print("rlcore-plan: --rehearse runs the RL trainer's phases; rm_* and sft_* configs have none to rehearse", file=sys.stderr)
            return 1
        ok = rehearsal_report(cfg) and ok
    return 0 if ok else 1


def rehearsal_report(cfg) -> bool:
    """Prints the rehearsal beside the plan; whether every phase fits."""
    from rlcore.cli.rehearsal import format_rehearsal, rehearse

    plan, _ = diagnose(cfg)
    try:
        rehearsal = rehearse(cfg, plan)
    except (NotImplementedError, ValueError) as err:
        print(f"rlcore-plan: not rehearsed: {err}", file=sys.stderr)
        return False
    text, fits = format_rehearsal(rehearsal, memory_plan(cfg, plan))
    print(text)
    return fits


if __name__ == "__main__":
    sys.exit(main())
