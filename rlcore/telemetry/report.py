"""The utilisation report: where a run's time went and the largest lever, from the files it left in its directory
(metrics.jsonl, ranks.jsonl and perf.json, written by rlcore.telemetry.perf). Printed at the end of a run and by
`rlcore-report RUN_DIR`.

Shares are of the wall time of the steps summarised (each step plus its validation and checkpoint). The first step
is left out when there are three or more: it pays for warm-up (first allocations, first compilations).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from rlcore.telemetry.perf import compute_s, dispatch_s
from rlcore.telemetry.plots import read_metrics

# Report rows in the order a step runs them: (row, timing_s key or None for a derived row, what it is)
PHASES = (
    ("gen", "gen", "generation on the workers"), ("weight sync", None, "training weights into the rollout engine"),
    ("reward model", "reward_model", "reward-model forward"), ("reward", "reward", "rule/custom scoring in the controller"),
    ("old log-prob", "old_log_prob", "log-prob forward"), ("ref log-prob", "ref", "reference forward"),
    ("values", "values", "critic forward"), ("advantages", "adv", "in the controller"),
    ("update critic", "update_critic", "critic forward + backward"), ("update actor", "update_actor", "actor forward + backward"),
    ("dispatch/transfer", None, "Ray calls: batches out, results back"), ("other", None, "the controller between phases"),
    ("validation", "testing", "trainer.test_freq"), ("checkpoint", "save_checkpoint", "trainer.save_freq"),
)
MFU_PHASE = {"gen": "gen", "reward model": "reward_model", "old log-prob": "old_log_prob", "ref log-prob": "ref",
             "values": "values", "update critic": "update_critic", "update actor": "update_actor"}


@dataclass
class Summary:
    steps: list[int]
    wall_s: float  # per step, mean
    shares: dict[str, float]  # report row -> share of the wall time
    seconds: dict[str, float]  # report row -> seconds per step
    flops: dict[str, float] = field(default_factory=dict)  # report row -> achieved FLOP/s per device
    ranks: list[dict[str, float]] = field(default_factory=list)  # per rank: busy, late, wait, idle shares
    rollout: dict[str, float] = field(default_factory=dict)  # mean of the rollout/* stats (rank 0's replica)
    saves: int = 0  # checkpoints among the steps


def load_run(run_dir: str) -> tuple[list[dict], dict[int, dict], dict]:
    """(metric rows, ranks.jsonl rows by step, perf.json); the last two are empty for runs without them."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    ranks_path, facts = os.path.join(run_dir, "ranks.jsonl"), {}
    # The same tolerant reader: a killed run's last line may be cut short.
    ranks = {row["step"]: row for row in read_metrics(ranks_path)} if os.path.exists(ranks_path) else {}
    if os.path.exists(os.path.join(run_dir, "perf.json")):
        with open(os.path.join(run_dir, "perf.json")) as f:
            facts = json.load(f)
    return rows, ranks, facts


def summarise(rows: list[dict], ranks: dict[int, dict]) -> Summary | None:
    """Per-step means over the steady-state steps that have timing_s/step; None if there are none."""
    steps = [row for row in rows if "timing_s/step" in row]
    if len(steps) >= 3:
        steps = steps[1:]
    if not steps:
        return None
    n = len(steps)
    mean = lambda key: sum(row.get(key, 0.0) for row in steps) / n  # noqa: E731
    wall = mean("timing_s/step") + mean("timing_s/testing") + mean("timing_s/save_checkpoint")
    # Each phase's timer includes its calls' dispatch and transfer: moved to a row of their own.
    dispatch: dict[str, float] = {}
    for row in steps:
        for phase, entry in ranks.get(row["step"], {}).get("phases", {}).items():
            dispatch[phase] = dispatch.get(phase, 0.0) + dispatch_s(entry) / n
    seconds = {name: mean(f"timing_s/{key}") - dispatch.get(key, 0.0) for name, key, _ in PHASES if key}
    seconds["weight sync"] = mean("timing_s/update_weights")  # rank 0's, inside its generation call
    seconds["gen"] -= seconds["weight sync"]
    seconds["dispatch/transfer"] = sum(dispatch.values())
    inner = sum(v for name, v in seconds.items() if name not in ("validation", "checkpoint"))
    seconds["other"] = max(mean("timing_s/step") - inner, 0.0)
    seconds = {name: v for name, v in seconds.items() if v > 0}
    flops = {}
    for name, phase in MFU_PHASE.items():
        series = [(row[f"perf/gflops_per_device/{phase}"], compute_s(row, phase, ranks.get(row["step"], {}).get("phases", {}).get(phase)))
                  for row in steps if f"perf/gflops_per_device/{phase}" in row]
        total_s = sum(s for _, s in series)
        if total_s > 0:  # FLOP-weighted: total FLOPs over total seconds
            flops[name] = sum(g * s for g, s in series) / total_s * 1e9
    rollout = {key[len("rollout/"):]: mean(key) for key in ("rollout/kv_slots", "rollout/prefills", "rollout/peak_running",
                                                            "rollout/graph_capture_s") if key in steps[-1]}
    return Summary([row["step"] for row in steps], wall, {k: v / wall for k, v in seconds.items()}, seconds, flops,
                   _rank_shares([ranks[row["step"]] for row in steps if row["step"] in ranks]), rollout,
                   sum("timing_s/save_checkpoint" in row for row in steps))


def _rank_shares(rows: list[dict]) -> list[dict[str, float]]:
    """Per rank, the share of the wall time it was busy in a method, late (the call had not reached it yet),
    waiting for the slowest rank, and idle (no call of its pool in flight: the controller's time)."""
    if not rows:
        return []
    wall = sum(row["wall_s"] for row in rows)
    world = len(next(iter(rows[0]["phases"].values()))["busy_s"])
    out = []
    for r in range(world):
        share = {key: sum(p[f"{key}_s"][r] for row in rows for p in row["phases"].values()) / wall for key in ("busy", "late", "wait")}
        share["idle"] = max(1.0 - sum(share.values()), 0.0)
        out.append(share)
    return out


def levers(summary: Summary, facts: dict) -> list[tuple[float, str]]:
    """(share of the step it addresses, advice) for every rule that fires, largest first. Each rule names the
    measured figure that fired it and the key that changes it."""
    s, settings, shares = summary, facts.get("settings", {}), summary.shares
    out: list[tuple[float, str]] = []
    world, tp = facts.get("world_size", 1), settings.get("actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    tbs, n = settings.get("data.train_batch_size"), settings.get("actor_rollout_ref.rollout.n")
    gen = shares.get("gen", 0.0)
    if tbs and n:
        replicas = max(world // tp, 1)
        per_replica = tbs * n // replicas
        kv, prefills = s.rollout.get("kv_slots"), s.rollout.get("prefills", 1.0)
        if kv and kv < per_replica and prefills > 1:
            waves = math.ceil(per_replica / kv)
            out.append((gen * (1 - 1 / waves), f"the KV cache holds {kv:.0f} sequences per replica, so each replica's {per_replica} "
                        f"samples ran in {waves} waves (generation is {gen:.0%} of the step): raise actor_rollout_ref.rollout."
                        f"gpu_memory_utilization (now {settings.get('actor_rollout_ref.rollout.gpu_memory_utilization')}) or "
                        f"max_num_seqs (now {settings.get('actor_rollout_ref.rollout.max_num_seqs')}) so they decode together"))
        elif gen >= 0.3 and per_replica < 256:
            out.append((gen, f"generation is {gen:.0%} of the step and the rollout batch is {per_replica} samples per replica "
                        f"({tbs} prompts x rollout.n={n} over {replicas} replica{'s' if replicas > 1 else ''}): a decode step "
                        "reads every weight once for all its sequences, so more sequences per step cost little more time "
                        "each: raise data.train_batch_size or actor_rollout_ref.rollout.n"))
    capture = s.rollout.get("graph_capture_s", 0.0) / s.wall_s if s.wall_s else 0.0
    if capture >= 0.05:  # the native engine captures its decode graphs again after every sleep (rollout/graphs.py)
        keep = ("set actor_rollout_ref.rollout.free_cache_engine=False where the training phases fit beside the KV cache "
                "(rlcore-plan shows both), so the engine never sleeps and captures once; or "
                if settings.get("actor_rollout_ref.rollout.free_cache_engine", True) else "")
        out.append((capture, f"capturing the rollout's decode graphs takes {capture:.0%} of the step "
                    f"({s.rollout['graph_capture_s']:.2f} s): {keep}list fewer actor_rollout_ref.rollout.cudagraph_capture_sizes "
                    f"(now {settings.get('actor_rollout_ref.rollout.cudagraph_capture_sizes') or 'every 8 up to max_num_seqs'})"))
    wait = sum(r["wait"] for r in s.ranks) / len(s.ranks) if s.ranks else 0.0
    if wait >= 0.05:
        fix = ("enable trainer.balance_batch" if not settings.get("trainer.balance_batch") else
               "enable actor_rollout_ref.actor.use_dynamic_bsz (micro-batches of equal tokens)" if not settings.get("actor_rollout_ref.actor.use_dynamic_bsz")
               else "response lengths differ between ranks: lower data.max_response_length or raise the samples per rank so they average out")
        out.append((wait, f"ranks wait {wait:.0%} of the step for the slowest rank: {fix}"))
    late = sum(r["late"] for r in s.ranks) / len(s.ranks) if s.ranks else 0.0
    if shares.get("dispatch/transfer", 0.0) >= 0.05:
        out.append((shares["dispatch/transfer"], f"dispatch and transfer take {shares['dispatch/transfer']:.0%} of the step "
                    f"(calls reach the ranks {late:.0%} late on average): each call moves its batch through Ray's object "
                    "store, a cost per call that larger batches (data.train_batch_size) spread over more samples"))
    if shares.get("reward", 0.0) >= 0.1:
        out.append((shares["reward"], f"reward scoring in the controller is {shares['reward']:.0%} of the step, with the devices idle: "
                    f"raise reward_model.score_workers (now {settings.get('reward_model.score_workers')})"))
    if shares.get("weight sync", 0.0) >= 0.1:
        out.append((shares["weight sync"], f"the weight sync is {shares['weight sync']:.0%} of the step: raise actor_rollout_ref."
                    "rollout.checkpoint_engine.update_weights_bucket_megabytes (fewer, larger gathers)"))
    if shares.get("validation", 0.0) >= 0.15:
        out.append((shares["validation"], f"validation is {shares['validation']:.0%} of the run (trainer.test_freq="
                    f"{settings.get('trainer.test_freq')}): raise trainer.test_freq or set data.val_max_samples"))
    if shares.get("checkpoint", 0.0) >= 0.1 and s.saves > 1:  # one save: the final one, which every run makes
        out.append((shares["checkpoint"], f"checkpoints are {shares['checkpoint']:.0%} of the run (trainer.save_freq="
                    f"{settings.get('trainer.save_freq')}): raise trainer.save_freq"))
    return sorted(out, key=lambda lever: -lever[0])


def format_report(run_dir: str) -> str | None:
    """The report as text; None for a directory without training steps."""
    rows, ranks, facts = load_run(run_dir)
    summary = summarise(rows, ranks)
    if summary is None:
        return None
    peak = facts.get("peak_flops")
    first, last = summary.steps[0], summary.steps[-1]
    lines = [f"utilisation report: {run_dir} (steps {first}-{last}, {summary.wall_s:.3f} s per step with validation and checkpoints)"]
    if facts:
        lines.append(f"devices: {facts['world_size']} x {facts['device']}, peak {_flops(peak)} per device ({facts['peak_source']})")
    lines += ["", f"{'phase':<18}{'share':>7}{'s/step':>9}{'FLOP/s/dev':>15}{'MFU':>7}  what"]
    for name, _, what in PHASES:
        if name not in summary.seconds:
            continue
        achieved = summary.flops.get(name)
        mfu = f"{achieved / peak:.1%}" if achieved and peak else ""
        lines.append(f"{name:<18}{summary.shares[name]:>7.1%}{summary.seconds[name]:>9.3f}{_flops(achieved) if achieved else '':>15}{mfu:>7}  {what}")
    if summary.ranks:
        lines += ["", "per rank (share of the wall time): busy in a method | call not there yet (dispatch) | waiting for the "
                  "slowest rank | idle (controller)"]
        for r, share in enumerate(summary.ranks):
            lines.append(f"  rank {r:<3} busy {share['busy']:6.1%}  late {share['late']:6.1%}  waiting {share['wait']:6.1%}  idle {share['idle']:6.1%}")
    lines += memory_lines(rows, facts)
    found = levers(summary, facts)
    lines.append("")
    if found:
        lines.append(f"largest lever: {found[0][1]}")
        lines += [f"then: {text}" for _, text in found[1:]]
    else:
        lines.append("no lever fired: no phase or wait stands out")
    return "\n".join(lines)


LEDGER_PHASES = ("generate", "old_log_prob", "ref", "update_actor", "update_critic")
LEDGER_CATEGORIES = ("params", "grads", "optimizer", "rollout_weights", "kv_cache", "transient", "allocated", "peak")


def memory_lines(rows: list[dict], facts: dict) -> list[str]:
    """The memory ledger of the last step that has one (rank 0's device, by category: rlcore.workers.phases) beside
    the plan's estimate of the same phase's peak (perf.json); nothing for runs without a ledger."""
    last = next((row for row in reversed(rows) if any(k.startswith("perf/memory/") for k in row)), None)
    if last is None:
        return []
    plan = facts.get("memory_plan", {})
    cols = [c for c in LEDGER_CATEGORIES if any(f"perf/memory/{p}/{c}_gib" in last for p in LEDGER_PHASES)]
    lines = ["", f"memory per phase (GiB on rank 0's device at step {last.get('training/global_step', '?')}; "
                 "plan: rlcore-plan's estimate of the phase's peak, activations and runtime included)",
             f"  {'phase':<14}" + "".join(f"{c:>16}" for c in cols) + f"{'plan':>10}"]
    for phase in LEDGER_PHASES:
        if not any(f"perf/memory/{phase}/{c}_gib" in last for c in cols):
            continue
        cells = [last.get(f"perf/memory/{phase}/{c}_gib") for c in cols]
        lines.append(f"  {phase:<14}" + "".join(f"{v:>16.3f}" if v is not None else f"{'-':>16}" for v in cells)
                     + (f"{plan[phase]:>10.2f}" if phase in plan else f"{'-':>10}"))
    return lines


def _flops(value: float | None) -> str:
    if not value:
        return "?"
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value / 1e6:.1f} MFLOP/s"
