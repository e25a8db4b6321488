"""Where a step's time goes, measured as it runs: each phase's seconds, each rank's busy time inside the worker
methods, the time ranks wait for the slowest one, the round trips' dispatch and transfer, and achieved FLOP/s.

Every worker-group call returns when each rank started the method and its seconds inside it (`Worker.timed_call`);
the controller times the whole round trip from its send. For one call, rank r is
- late by `start_r` (dispatch: splitting the batch, Ray, transfer, deserialisation, or the rank still busy),
- busy for `busy_r`,
- waiting for the slowest rank for `end - (start_r + busy_r)`, where `end` is the last rank's finish,
and the call's results take `span - end` to come back (return). The rest of a step's wall time the devices wait on
the controller (rewards, advantages, batch balancing) or on groups of another pool.

Waiting inside a method (a rank blocked in a collective on a slower peer mid-update) counts as busy here: FSDP and
TP ranks meet at every layer, so their imbalance shows up in the method's length, and the token balance levers
(trainer.balance_batch, use_dynamic_bsz) are what shorten it. Generation has no collectives between replicas, so
there the whole wait is measured.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

# Group methods that do model FLOPs, as multiples of one forward pass over the batch's valid tokens. Generation
# runs each token through the model once (the KV cache holds the rest), like a log-prob pass.
FORWARD_PASSES = {"gen": 1, "old_log_prob": 1, "ref": 1, "values": 1, "reward_model": 1}
TRAIN_PHASES = ("update_actor", "update_critic")  # forward + backward = 3 forward passes per epoch


@contextmanager
def timer(name: str, metrics: dict[str, float]):
    """Adds the block's seconds to metrics["timing_s/<name>"]: summed, as with dynamic sampling a step generates and
    scores several batches."""
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = metrics.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


def forward_flops(shape: dict[str, int], seq_lens: list[int], logit_tokens: int) -> float:
    """One forward pass over sequences of these lengths: 2 FLOPs per block weight per token, 2 per output-head
    weight per token that gets logits (the response's: log-probs and sampling need no others; a value head is
    `hidden` wide), and causal attention's QK^T and AV, 2 x 2 x L^2/2 x width per layer. Embedding lookups are free."""
    return (2.0 * shape["body"] * sum(seq_lens) + 2.0 * shape["head"] * logit_tokens
            + 2.0 * shape["layers"] * shape["attn_width"] * sum(n * n for n in seq_lens))


def dispatch_s(entry: dict | None) -> float:
    """A phase's dispatch + transfer seconds in one step (a ranks.jsonl phase entry): the ranks' mean lateness
    plus the results' way back."""
    if not entry:
        return 0.0
    return sum(entry["late_s"]) / len(entry["late_s"]) + entry["return_s"]


def compute_s(metrics: dict[str, float], phase: str, entry: dict | None) -> float:
    """The seconds a phase computed in a step: its timer without its dispatch and transfer, and generation without
    the weight sync it starts with."""
    sync = metrics.get("timing_s/update_weights", 0.0) if phase == "gen" else 0.0
    return metrics.get(f"timing_s/{phase}", 0.0) - sync - dispatch_s(entry)


class StepPerf:
    """Per-phase, per-rank accounting for PPOTrainer: `with perf.phase("gen", metrics):` around each phase, then
    `end_step()` returns the step's perf/* metrics and appends the per-rank detail to ranks.jsonl."""

    def __init__(self, groups: dict, run_dir: str | None, model_flops: dict | None, peak_flops: float | None,
                 update_passes: dict[str, float]) -> None:
        self.groups = {role: g for role, g in groups.items() if hasattr(g, "drain_calls")}  # (test doubles have none)
        for group in self.groups.values():
            group.record_calls = True
        self.main_pool = getattr(groups["actor_rollout"], "pool", None)
        self.ranks_path = os.path.join(run_dir, "ranks.jsonl") if run_dir else None
        self.model_flops, self.peak = model_flops, peak_flops  # model_flops: model_shapes() by role
        self.update_passes = update_passes  # forward-pass equivalents of one update, by phase
        self.phases: dict[str, dict] = {}
        self.seq_lens: list[int] = []
        self.response_tokens = 0

    @contextmanager
    def phase(self, name: str, metrics: dict[str, float]):
        """`timer(name, metrics)` that also files the group calls made in the block under the phase."""
        self._drain(None)  # calls made outside any phase (validation before training, model loading) are no step's
        try:
            with timer(name, metrics):
                yield
        finally:
            self._drain(name)

    def count_tokens(self, batch) -> None:
        """The step's sequences (valid prompt + response tokens): what the FLOP counts are over."""
        self.seq_lens = batch.batch["attention_mask"].sum(-1).tolist()
        self.response_tokens = int(batch.batch["response_mask"].sum())

    def _drain(self, phase: str | None) -> None:
        """Files the group calls made since the last drain under `phase` (None: drops them)."""
        for role, group in self.groups.items():
            calls = group.drain_calls()
            if phase is None or group.pool is not self.main_pool:  # another pool has its own devices
                continue
            for call in calls:
                world = len(call.busy_s)
                entry = self.phases.setdefault(phase, {"busy_s": [0.0] * world, "late_s": [0.0] * world, "wait_s": [0.0] * world,
                                                       "return_s": 0.0, "roles": []})
                if len(entry["busy_s"]) != world:  # a colocated group of another size: not per-device
                    continue
                finish = [start + busy for start, busy in zip(call.start_s, call.busy_s)]
                end = max(finish)
                for r in range(world):
                    entry["busy_s"][r] += call.busy_s[r]
                    entry["late_s"][r] += call.start_s[r]
                    entry["wait_s"][r] += end - finish[r]
                entry["return_s"] += max(call.span_s - end, 0.0)
                if role not in entry["roles"]:
                    entry["roles"].append(role)

    def end_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The step's perf/* metrics: device shares of the step's wall time, and achieved FLOP/s per phase."""
        self._drain(None)
        wall = sum(metrics.get(f"timing_s/{name}", 0.0) for name in ("step", "testing", "save_checkpoint"))
        phases, self.phases = self.phases, {}
        out: dict[str, float] = {}
        if phases and wall > 0:
            world = len(next(iter(phases.values()))["busy_s"])
            mean = lambda key: sum(sum(p[key]) for p in phases.values()) / world  # noqa: E731 -- over ranks, summed over phases
            dispatch = mean("late_s") + sum(p["return_s"] for p in phases.values())
            out = {"perf/device_busy_share": mean("busy_s") / wall, "perf/wait_slowest_share": mean("wait_s") / wall,
                   "perf/dispatch_share": dispatch / wall}
            out["perf/controller_share"] = max(1.0 - out["perf/device_busy_share"] - out["perf/wait_slowest_share"] - out["perf/dispatch_share"], 0.0)
            out.update(self._flops(metrics, world, phases))
            if self.ranks_path:
                with open(self.ranks_path, "a") as f:
                    f.write(json.dumps({"step": step, "wall_s": wall, "phases": phases}) + "\n")
        return out

    def _flops(self, metrics: dict[str, float], world: int, phases: dict[str, dict]) -> dict[str, float]:
        """perf/gflops_per_device/<phase> and perf/mfu/<phase>: the phase's model FLOPs over its compute seconds
        (`compute_s`) and devices."""
        out = {}
        if not self.model_flops or not self.seq_lens:
            return out
        for phase in (*FORWARD_PASSES, *TRAIN_PHASES):
            seconds = compute_s(metrics, phase, phases.get(phase))
            role = "critic" if phase in ("values", "update_critic") else "reward_model" if phase == "reward_model" else "actor"
            shape = self.model_flops.get(role)
            if seconds <= 0 or shape is None:
                continue
            passes = FORWARD_PASSES.get(phase) or self.update_passes.get(phase, 3.0)
            # A reward model scores each sequence from its last token: one row of its (1-wide) head per sample.
            logit_tokens = len(self.seq_lens) if role == "reward_model" else self.response_tokens
            achieved = passes * forward_flops(shape, self.seq_lens, logit_tokens) / seconds / world
            out[f"perf/gflops_per_device/{phase}"] = achieved / 1e9
            if self.peak:
                out[f"perf/mfu/{phase}"] = achieved / self.peak
        return out


def model_shapes(cfg, roles) -> dict[str, dict[str, int]]:
    """What the FLOP count needs of each role's model (from its config.json): block weights a token uses, output-head weights
    (the vocabulary's, or a 1-wide value head's), layers, and attention width."""
    from rlcore.plan.arch import resolve_arch

    paths = {"actor": (cfg.actor_rollout_ref.model.path, False), "critic": (cfg.critic.model.path, True),
             "reward_model": (cfg.reward.reward_model.model_path, True)}
    shapes = {}
    for role in roles:
        arch, _ = resolve_arch(paths[role][0])
        if arch is not None:
            head = arch.hidden if paths[role][1] else arch.vocab * arch.hidden
            # a MoE token uses only its top-k experts: the FLOPs (and MFU) count those
            shapes[role] = {"body": arch.active_blocks_params(), "head": head, "layers": arch.layers, "attn_width": arch.heads * arch.dim}
    return shapes


# The memory plan's roles under the names of the ledger's phases (rlcore.workers.phases).
PLAN_PHASES = {"rollout": "generate", "actor update": "update_actor", "reference log-probs": "ref", "critic update": "update_critic"}


def run_facts(cfg, world_size: int, peak: tuple[float, str], shapes: dict, planned: dict[str, float]) -> dict:
    """What rlcore-report needs besides the per-step metrics: the device's peak, the memory plan (`planned`: the
    run plan's peak per role, GiB per device), and the settings its levers name."""
    arr = cfg.actor_rollout_ref
    return {
        "peak_flops": peak[0], "peak_source": peak[1], "device": cfg.trainer.device, "world_size": world_size, "model": shapes,
        "memory_plan": {PLAN_PHASES[role]: peak for role, peak in planned.items() if role in PLAN_PHASES},
        "settings": {
            "data.train_batch_size": cfg.data.train_batch_size, "actor_rollout_ref.rollout.n": arr.rollout.n,
            "actor_rollout_ref.rollout.name": arr.rollout.name,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": arr.rollout.tensor_model_parallel_size,
            "actor_rollout_ref.rollout.gpu_memory_utilization": arr.rollout.gpu_memory_utilization,
            "actor_rollout_ref.rollout.max_num_seqs": arr.rollout.max_num_seqs,
            "actor_rollout_ref.rollout.free_cache_engine": arr.rollout.free_cache_engine,
            "actor_rollout_ref.rollout.cudagraph_capture_sizes": (None if arr.rollout.cudagraph_capture_sizes is None
                                                                   else list(arr.rollout.cudagraph_capture_sizes)),
            "trainer.balance_batch": cfg.trainer.balance_batch, "actor_rollout_ref.actor.use_dynamic_bsz": arr.actor.use_dynamic_bsz,
            "trainer.test_freq": cfg.trainer.test_freq, "trainer.save_freq": cfg.trainer.save_freq,
            "reward_model.score_workers": cfg.reward_model.score_workers,
        },
    }


def start_step_perf(cfg, groups: dict, run_dir: str | None, planned: dict[str, float]) -> StepPerf:
    """Measures the device's peak on actor rank 0, writes {run_dir}/perf.json (for rlcore-report) and returns the
    step accounting. `planned`: RunPlan.planned_peaks."""
    import ray

    actor = groups["actor_rollout"]
    peak = ray.get(actor.workers[0].peak_flops.remote())
    roles = ["actor"] + [role for role in ("critic", "reward_model") if role in groups]
    shapes = model_shapes(cfg, roles)
    if run_dir:
        with open(os.path.join(run_dir, "perf.json"), "w") as f:
            json.dump(run_facts(cfg, actor.world_size, peak, shapes, planned), f, indent=1)
    # Forward + backward (2x) per epoch. MFU counts the model's FLOPs only (PaLM's definition): the forward that
    # gradient checkpointing recomputes is the price of its memory, so it lowers MFU rather than adding to it (an H200
    # run counting it showed checkpointing 6% "faster per FLOP" while it took 26% longer, docs/benchmarks.md).
    passes = {"update_actor": 3 * cfg.actor_rollout_ref.actor.ppo_epochs, "update_critic": 3 * cfg.critic.ppo_epochs}
    return StepPerf(groups, run_dir, shapes, peak[0], passes)
