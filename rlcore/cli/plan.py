"""`rlcore-plan [--config-name NAME] [-m] [--elsewhere] [--rehearse] key=value ...`: the config doctor.

Composes the config exactly as `rlcore-train` would (same overrides, recipes, `+key=value`), then prints every
violation at once with its fix, the batch plan and the per-device memory plan with a verdict per role. The checks
are the ones `rlcore-train` runs before Ray starts (rlcore.cli.preflight): the schema's rules, the registries'
names, the model, tokenizer, data and reward files on this machine, heads vs TP/SP. A config named rm_* or sft_*
is composed as `rlcore-rm` / `rlcore-sft` would, and planned as that one training role. Nothing is loaded and Ray
is not imported (torch is, for the registries), so it answers in a few seconds for any model in the built-in table,
on any machine. Exit status: 0 when the config is valid and every role fits or is tight, 1 otherwise.

`-m` / `--multirun` plans every job of a sweep (`a=1,2 b=x,y`: four jobs) and prints one table: errors, and each
role's peak and verdict per job. `--elsewhere` plans a job that will run on another machine: paths missing here
are warnings, not errors.

`--rehearse` then checks the plan against the real engine code: the FSDP2 engines are built and one step's phases
run on fake tensors over a fake world of the config's size (rlcore.cli.rehearsal; about 20 s for a 7B model
on 2 CPU cores, no memory beyond a few hundred MB), printing each phase's peak per rank beside the plan; it fails
when a phase does not fit.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from rlcore.cli.overrides import ComposeError, compose_explained, expand_sweep, schema_keys, set_existing_keys, varying
from rlcore.cli.preflight import preflight
from rlcore.config import compose, external_config_dir, format_plan
from rlcore.config.key_status import ineffective_settings
from rlcore.config.renamed import renamed_notes
from rlcore.plan import format_memory, supervised_memory_plan
from rlcore.plan.heads import policy_heads
from rlcore.plan.run_plan import plan_run
from rlcore.plan.speed import speed_hints

USAGE = ("usage: rlcore-plan [--config-path DIR] [--config-name ppo_trainer|ppo_megatron_trainer|rm_trainer|sft_trainer|...] [-m] [--elsewhere] "
         "[--rehearse] [recipe=NAME] [key=value ...]")


@dataclass
class Args:
    config_name: str = "ppo_trainer"
    overrides: list[str] = field(default_factory=list)
    rehearse: bool = False
    sweep: bool = False
    elsewhere: bool = False
    config_dir: str | None = None  # a verl example's --config-path (None: rlcore's configs)


def parse_args(argv: list[str]) -> Args:
    args, it = Args(), iter(argv)
    flags = {"--rehearse": "rehearse", "-m": "sweep", "--multirun": "sweep", "--elsewhere": "elsewhere"}
    for arg in it:
        if arg in ("-h", "--help"):
            raise SystemExit(f"{USAGE}\n\n{__doc__}")
        if arg in flags:
            setattr(args, flags[arg], True)
        elif arg in ("--config-name", "-cn"):
            args.config_name = next(it, None) or sys.exit(f"rlcore-plan: --config-name needs a value\n{USAGE}")
        elif arg.startswith("--config-name="):
            args.config_name = arg.split("=", 1)[1]
        elif arg in ("--config-path", "-cp") or arg.startswith("--config-path="):
            path = arg.split("=", 1)[1] if "=" in arg else next(it, None) or sys.exit(f"rlcore-plan: {arg} needs a value\n{USAGE}")
            args.config_dir = external_config_dir(path)
        elif arg.startswith("-"):
            raise SystemExit(f"rlcore-plan: unknown option {arg}\n{USAGE}")
        else:
            args.overrides.append(arg)
    return args


@dataclass
class Diagnosis:
    """One composed config's verdict: every error, the warnings, and the report to print."""

    errors: list[str]
    warnings: list[str]
    memory: object  # rlcore.plan.MemoryPlan
    report: str
    batch: object = None  # the BatchPlan of a PPO config that has one

    @property
    def ok(self) -> bool:
        return not self.errors and self.memory.ok

    def verdict(self, refused: int = 0) -> str:
        """The report's last line: what a reader scanning for the outcome wants (the exit status says it too)."""
        tight = [r.role for r in self.memory.roles if r.verdict == "tight"]
        if self.ok and not refused:
            return "rlcore-plan: OK, 0 errors, every phase fits" + (f" ({', '.join(tight)} tight)" if tight else "")
        over = [r.role for r in self.memory.roles if r.verdict == "OOM"]
        parts = [f"{refused} override(s) refused"] if refused else []
        parts += [f"{len(self.errors)} config error(s)"] if self.errors else []  # the memory plan's own among them
        parts += [f"over the device memory: {', '.join(over)}"] if over else []
        return "rlcore-plan: FAIL, " + ", ".join(parts)


def _report(cfg, errors: list[str], warnings: list[str], sections: list[str]) -> str:
    """Keys set to no effect first (the user expects theirs), then errors, warnings and the plans."""
    ignored, renamed = ineffective_settings(cfg), renamed_notes(cfg)
    lines = [f"{len(ignored)} key(s) set with no effect:"] + [f"  - {line}" for line in ignored] if ignored else []
    lines += [f"{len(renamed)} key(s) under another of verl's names:"] + [f"  - {line}" for line in renamed] if renamed else []
    lines += [f"{len(errors)} config error(s):"] + [f"  {i}. {e}" for i, e in enumerate(errors, 1)] if errors else []
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines + sections)


def doctor(cfg, where: str = "plan") -> Diagnosis:
    """The RL trainer's checks (what rlcore-train refuses) and plans for a composed config."""
    run, errors = plan_run(cfg, policy_heads(cfg))  # the plan rlcore-train derives and runs by
    plan, mem = run.batch, run.memory
    checked = preflight(cfg, where, known=errors)
    errors = errors + checked.errors
    sections = ([format_plan(plan)] if plan is not None else []) + [format_memory(mem)]
    return Diagnosis(errors, checked.warnings, mem, _report(cfg, errors, checked.warnings, sections), plan)


def supervised_doctor(cfg, pairs: bool) -> Diagnosis:
    """An rlcore-rm (`pairs`) or rlcore-sft config: its rule violations and its memory plan."""
    from rlcore.config.rm_schema import rm_config_errors
    from rlcore.train_sft import sft_config_errors

    mem = supervised_memory_plan(cfg, pairs)
    errors = (rm_config_errors(cfg) if pairs else sft_config_errors(cfg)) + mem.errors
    return Diagnosis(errors, [], mem, _report(cfg, errors, [], [format_memory(mem)]))


def composer(config_name: str, config_dir: str | None = None):
    """(compose(overrides), doctor(cfg, where)) for a config name: rm_* and sft_* with their trainers' schemas;
    `config_dir`: a verl example's config folder (--config-path), whose YAML builds on rlcore's ppo_trainer."""
    if config_name.startswith("rm_"):
        from rlcore.train_rm import compose_rm

        return lambda o: compose_rm(o, config_name), lambda cfg, where: supervised_doctor(cfg, pairs=True)
    if config_name.startswith("sft_"):
        from rlcore.train_sft import compose_sft

        return lambda o: compose_sft(o, config_name), lambda cfg, where: supervised_doctor(cfg, pairs=False)
    return lambda o: compose(o, config_name=config_name, config_dir=config_dir), doctor


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    compose_fn, check = composer(args.config_name, args.config_dir)
    args.overrides = set_existing_keys(args.overrides, schema_keys(args.config_name))
    where = "elsewhere" if args.elsewhere else "plan"
    if args.sweep:
        return sweep(compose_fn, check, args.overrides, where)
    try:
        cfg = compose_explained(compose_fn, args.overrides)
    except ComposeError as err:
        print(f"rlcore-plan: the config does not compose: {err}", file=sys.stderr)
        if err.partial is not None:
            # All problems at once: the rest of the command line, checked and planned as if the refused overrides
            # were fixed
            rest = check(err.partial, where)
            print(f"rlcore-plan: without the {len(err.problems)} override(s) above, the rest has "
                  f"{len(rest.errors)} config error(s) of its own{':' if rest.errors else ''}", file=sys.stderr)
            for error in rest.errors:
                print(f"  - {error}", file=sys.stderr)
            print(rest.report, flush=True)
            print(rest.verdict(refused=len(err.problems)), flush=True)
        return 1
    result = check(cfg, where)
    print(result.report, flush=True)
    ok = result.ok
    if check is doctor and ok:  # what spare memory could buy: a few more plans each, so one config's check only
        for hint in speed_hints(cfg, result.batch, result.memory):
            print(f"speed: {hint}", flush=True)
    if args.rehearse:
        if check is not doctor:
            print("rlcore-plan: --rehearse runs the RL trainer's phases; rm_* and sft_* configs have none to rehearse", file=sys.stderr)
            return 1
        rehearsed = rehearsal_report(cfg)
        if not rehearsed:
            print("rlcore-plan: FAIL, a phase of the rehearsal does not fit (or could not run: above)", flush=True)
            return 1
    print(result.verdict(), flush=True)
    return 0 if ok else 1


def sweep(compose_fn, check, overrides: list[str], where: str) -> int:
    """Plans every job of a basic sweep; prints each job's errors, then one table. 0 when every job passes."""
    try:
        jobs = expand_sweep(overrides)
    except ComposeError as err:
        print(f"rlcore-plan: the sweep does not parse: {err}", file=sys.stderr)
        return 1
    rows = []
    for i, (job, shown) in enumerate(zip(jobs, varying(jobs))):
        label = " ".join(shown) or "(no overrides)"
        try:
            result = check(compose_explained(compose_fn, job), where)
        except ComposeError as err:
            print(f"job {i} ({label}): does not compose: {err}")
            rows.append((label, None))
            continue
        for n, error in enumerate(result.errors, 1):
            print(f"job {i} ({label}): error {n}: {error}")
        rows.append((label, result))
    print(format_sweep(rows), flush=True)
    return 0 if all(r is not None and r.ok for _, r in rows) else 1


def format_sweep(rows: list[tuple[str, Diagnosis | None]]) -> str:
    """One row per job: its overrides, error count, and per role `peak GiB verdict` (roles in order of first use)."""
    roles: list[str] = []
    for _, result in rows:
        for role in result.memory.roles if result else []:
            if role.role not in roles:
                roles.append(role.role)
    header = ["#", "overrides", "errors", *roles, "verdict"]
    table = [header]
    for i, (label, result) in enumerate(rows):
        if result is None:
            table.append([str(i), label, "compose", *["" for _ in roles], "FAIL"])
            continue
        peaks = {r.role: f"{r.peak:.1f} {r.verdict}" for r in result.memory.roles}
        table.append([str(i), label, str(len(result.errors)), *[peaks.get(role, "-") for role in roles],
                      "ok" if result.ok else "FAIL"])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if c == 1 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))) for row in table]
    return "\n".join([f"rlcore-plan sweep summary ({len(rows)} jobs; per role: peak GiB per device and verdict)"] + lines)


def rehearsal_report(cfg) -> bool:
    """Prints the rehearsal beside the plan; whether every phase fits."""
    from rlcore.cli.rehearsal import format_rehearsal, rehearse

    run, _ = plan_run(cfg)
    try:
        rehearsal = rehearse(cfg, run.batch)
    except (NotImplementedError, ValueError) as err:
        print(f"rlcore-plan: not rehearsed: {err}", file=sys.stderr)
        return False
    text, fits = format_rehearsal(rehearsal, run.memory)
    print(text)
    return fits


if __name__ == "__main__":
    sys.exit(main())
