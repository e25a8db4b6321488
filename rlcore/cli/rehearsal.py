"""`rlcore-plan --rehearse`: the memory plan checked against the real engine code, run on fake tensors.

torch's FakeTensorMode gives every tensor a shape, a dtype and a device but no storage; the `fake` process-group
backend answers every collective of an N-rank world from one process; torch's MemTracker counts the bytes the fake
tensors would take. So a 2-core CPU builds the FSDP2 engines of a 7B recipe as rank 0 of its 8 ranks (on the meta
device, sharded, rank 0's shard materialised) and runs one step's phases through the engines' own code, in the
order the hybrid engine runs them, each inside the same `phases.running` the workers use:

    load           the engines built as the worker builds them: on the meta device, sharded, rank 0's shard
    sync           actor.rollout_weights(): the gathered buckets the rollout receives
    generate       nothing runs: what the engines keep on the device beside vLLM's reservation
    old_log_prob   actor.forward() over one micro-batch of the recipe's log-prob token budget
    ref            ref.forward() likewise
    update_actor   actor.forward_backward() + optimizer_step() with the actor's token budget (run twice: AdamW
                   creates its moments in the first step; the second is the steady state)

A phase's peak per rank = the state the engines hold on the device in it (the ledger of rlcore.workers.phases, i.e.
what the offload flags leave resident, counted by MemTracker from the tensors themselves) + what the phase's code
allocates (gathered weights, activations, logit chunks, gradients, export buckets), at its highest point. Added,
not rehearsed: vLLM's reservation (gpu_memory_utilization x device memory, vLLM's own allocation) while it
generates, its weights during the sync, and the runtime (CUDA context, NCCL) the plan assumes.

Limits, said where they are printed: on a CPU device and host are one memory, so offloaded state is left out by
the engines' residency account rather than seen on another device; attention runs as padded SDPA over full-length
rows (the same tokens as a packed micro-batch of the budget, without padding), since the packed path's sequence
lengths are data and fake tensors have none; FSDP2 only (a Megatron role is reported as not rehearsed).

A vision-language model's rows each hold one image filling the prompt (the plan's bound on the tower's patches);
the token ids and image grids its code reads on the host stay real (rlcore.cli.host_values), the pixels are fake.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from rlcore.config.validate import uses_reference
from rlcore.plan.arch import Arch, hf_config, resolve_arch
from rlcore.plan.memory import ARR, GIB, Estimator, MemoryPlan, _Role, device_capacity, runtime_gib
from rlcore.rollout.sizing import rollout_sizing

# Measured with megatron-core 0.16.1 under a fake world of 8: it creates gloo groups beside the default group (the
# fake backend cannot back them; switchable), its optimizer exchanges parameter-group keys with all_gather_object
# (pickled bytes travel as tensor values, which fake tensors do not have), and every optimizer step reads values on
# the host (found_inf.item() in optimizer.py, total_norm.item() in clip_grads.py). tests/plan/
# test_plan_vs_megatron_ledger.py checks the plan's Megatron terms against a real 2-rank run instead.
MEGATRON_NOT_REHEARSED = ("the rehearsal covers strategy=fsdp2 only: megatron-core reads values on the host while it "
                          "builds its optimizer (all_gather_object) and in every step (found_inf.item(), the gradient "
                          "norm's .item()), which fake tensors do not have; its plan is checked against a real 2-rank "
                          "run's ledger instead (perf/memory/<phase>/* of a run shows the same)")

# The plan's role for each rehearsed phase (the phases without one have no separate line in the plan).
PLAN_ROLE = {"generate": "rollout", "ref": "reference log-probs", "update_actor": "actor update"}
TOLERANCE = 0.15  # plan vs rehearsal, per phase


@dataclass
class PhasePeak:
    phase: str
    measured: float                        # GiB per rank: MemTracker's peak over the phase's code
    by_kind: dict[str, float]              # the measured peak by MemTracker's categories (param, grad, act, ...)
    added: list[tuple[str, float]] = field(default_factory=list)  # (what, GiB) added, not rehearsed
    seconds: float = 0.0

    @property
    def peak(self) -> float:
        return self.measured + sum(gib for _, gib in self.added)


@dataclass
class Rehearsal:
    world: int
    capacity: float
    phases: list[PhasePeak]
    notes: list[str]

    def compare(self, mem: MemoryPlan) -> list[tuple[str, float, float | None]]:
        """(phase, rehearsed GiB, planned GiB or None) for every phase."""
        planned = {r.role: r.peak for r in mem.roles}
        return [(p.phase, p.peak, planned.get(PLAN_ROLE.get(p.phase, f"teacher {p.phase[len('teacher_'):]} scores"))) for p in self.phases]


def _model_dir(arch: Arch, path: str, workdir: str) -> str:
    """A directory whose config.json describes the model: the model's own when it has one, else one written from
    the built-in table (no weights are read either way)."""
    if os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        return os.path.expanduser(path)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(hf_config(arch), f)
    return workdir


def _micro_batch(rows: int, max_len: int, response_len: int, vocab: int, hf_config=None):
    """`rows` full-length samples: input ids, an all-ones mask, positions, the response ids (real, small tensors;
    the model's compute on them is fake). A vision-language model's rows (`hf_config` with a vision_config) each
    hold one image filling its prompt, as the memory plan bounds them: the tokens between the image's start and end
    markers, its fake pixels, its real grid (rlcore.cli.host_values keeps the grid and ids real)."""
    import torch

    from rlcore.models.vision import MULTI_MODAL_INPUTS, is_vision_config
    from rlcore.protocol import DataProto

    ids = torch.randint(0, vocab, (rows, max_len))
    non_tensors = {}
    if hf_config is not None and is_vision_config(hf_config):
        v, prompt = hf_config.vision_config, max_len - response_len
        specials = [hf_config.image_token_id, hf_config.video_token_id, hf_config.vision_start_token_id, hf_config.vision_end_token_id]
        ids[torch.isin(ids, torch.tensor(specials))] = 0
        height, width = _image_tokens(prompt)
        ids[:, 2] = hf_config.vision_start_token_id
        ids[:, 3:3 + height * width] = hf_config.image_token_id
        ids[:, 3 + height * width] = hf_config.vision_end_token_id
        merge = v.spatial_merge_size
        patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
        image = {"pixel_values": torch.zeros(height * width * merge ** 2, patch_dim),
                 "image_grid_thw": torch.tensor([[1, height * merge, width * merge]])}
        non_tensors[MULTI_MODAL_INPUTS] = [image] * rows
    return DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(max_len).expand(rows, max_len).clone(),
                                "responses": ids[:, max_len - response_len:].clone()}, non_tensors)


def _image_tokens(prompt: int) -> tuple[int, int]:
    """An image's (height, width) in merged tokens filling a prompt of `prompt` tokens but 4 (2 text tokens, the
    image's start and end markers)."""
    height = int((prompt - 4) ** 0.5)
    return height, (prompt - 4) // height


@contextmanager
def _fake_world(world: int) -> Iterator[None]:
    """A `fake` process group of `world` ranks in this process (rank 0), torn down after."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("rehearse() needs a process without a process group: it starts a fake one of the config's world size")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _tracker():
    """torch's MemTracker, made to accept frozen models: it hooks every parameter's gradient when a module first
    runs, which a parameter without requires_grad refuses (a reference policy). Their bytes are counted all the same.
    It keeps only the whole phase's peak, which is all the rehearsal reads: MemTracker also updates every tracked
    module's own peak after each op, a walk over all modules that made a 28-layer model's update quadratic in its
    depth (qwen2_7b_grpo's update phase: 44 s -> 4 s on 2 cores, the same peaks)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            trainable = all(p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks and trainable)

        def _update_peak_stats(self, peak_state) -> None:
            if not hasattr(self, "_peak_mem_snap"):  # another torch's layout: its own bookkeeping, slower
                return super()._update_peak_stats(peak_state)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

    return Tracker()


def _measure(phase: str, held: list, work: Callable[[], None]) -> PhasePeak:
    """Runs `work` under a MemTracker that first counts the `held` models / optimizers (what the phase keeps on
    the device); the peak of everything it saw, by category."""
    start = time.perf_counter()
    tracker = _tracker()
    with tracker:
        if held:
            tracker.track_external(*held)
        work()
    # The peak snapshot moves with each op; a phase that runs none (generate) holds what was tracked at its start.
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()), {}) or next(iter(tracker.get_tracker_snapshot("current").values()), {})
    by_kind = {str(kind).split(".")[-1].lower(): nbytes / GIB for kind, nbytes in peak.items() if str(kind) != "Total" and nbytes}
    return PhasePeak(phase, peak.get("Total", 0) / GIB, by_kind, seconds=time.perf_counter() - start)


def _held(engines: dict, phase: str) -> list:
    """The models and optimizers whose state `phase` holds on the device, from the engines' residency account
    (gradients are created and freed inside an FSDP2 update, and counted as they appear)."""
    from rlcore.workers import phases

    held = []
    for engine in engines.values():
        kinds = {kind for kind, nbytes in phases.engine_ledger(engine, phase).items() if nbytes}
        if "params" in kinds:
            held.append(engine.model)
        if "optimizer" in kinds and engine.optimizer is not None:
            held.append(engine.optimizer)
    return held


def rehearse(cfg: DictConfig, plan) -> Rehearsal:
    """Builds the engines of `cfg` and runs the phases of one step on fake tensors, as rank 0 of the config's world
    (`plan`: the config's BatchPlan, which sizes the micro-batches as the plan does)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rlcore.cli.host_values import HostValues
    from rlcore.engine.base import TokenRequest
    from rlcore.engine.factory import build_engine, engine_spec
    from rlcore.workers import phases

    t, arr = cfg.trainer, cfg[ARR]
    world = t.nnodes * t.n_gpus_per_node
    if arr.actor.strategy == "megatron":
        raise NotImplementedError(MEGATRON_NOT_REHEARSED)
    arch, where = resolve_arch(arr.model.path)
    if arch is None:
        raise ValueError(f"cannot rehearse: {where}")
    capacity, _ = device_capacity(cfg, t.n_gpus_per_node)
    est = Estimator(cfg, plan, capacity, t.device)
    max_len, resp = est.max_len, est.resp
    actor_role = est.training_role("actor update", arch, "actor", world)
    ref_role = est.training_role("reference log-probs", arch, "ref", world)
    use_ref = uses_reference(cfg) and not actor_role.lora_rank
    rows = {name: max(1, role.tokens // max_len) for name, role in (("actor", actor_role), ("ref", ref_role))}
    notes = [f"rank 0 of a fake world of {world}; {arch.name if where.startswith('built-in') else where}; "
             f"micro-batches of full-length rows ({max_len} tokens): update {rows['actor']} rows, log-probs {rows['ref']} rows; "
             "attention as padded SDPA"]
    if arch.vision is not None:
        height, width = _image_tokens(max_len - resp)
        notes.append(f"each row's prompt one image filling it: {height} x {width} merged tokens, {height * width * arch.vision.patches_per_token} "
                     "patches through the tower (the plan's bound); the tower's attention once per block over its windows")
    if actor_role.sp > 1:
        # The all-to-alls need the packed row's lengths, which fake tensors do not have: a rank's share is
        # rehearsed directly, as the rows of its 1/sp slice of every micro-batch.
        notes.append(f"Ulysses sp={actor_role.sp}: each rank rehearsed with its slice (1/{actor_role.sp}) of every micro-batch")
    rollout = arr.rollout
    # The rollout engine is not rehearsed (vLLM allocates for itself): the plan's terms for it, its weights alone
    # while the sync streams into them.
    rollout_items = est.rollout(arch, world)[0]
    woken = rollout_sizing(rollout.name).woken_for_sync(arch, rollout, rollout_items)
    runtime = (f"runtime (the plan's: {'CUDA context, NCCL' if t.device == 'cuda' else 'the Python/torch/Ray worker'})", runtime_gib(t.device))
    out = []
    with tempfile.TemporaryDirectory() as workdir, _fake_world(world), ExitStack() as stack:
        model_cfg = OmegaConf.merge(arr.model, {"path": _model_dir(arch, arr.model.path, workdir), "use_remove_padding": False})
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(HostValues())  # ids, image grids and masks real: HF's Qwen-VL code reads them on the host
        device = torch.device("cpu")

        def build(role: str, optim):
            section = arr[role]
            spec = engine_spec(section.strategy, model_cfg, section, optim, arr.actor.grad_clip, 1)
            spec.load_weights, spec.ulysses_sp = False, 1  # a Ulysses rank's slice is rehearsed as its rows (notes)
            return build_engine(section.strategy, spec, device)

        engines = {}

        def load():  # as the worker's init_model: actor, reference, the reference offloaded (the actor is, after)
            engines["actor"] = build("actor", arr.actor.optim)
            if use_ref:
                engines["ref"] = build("ref", None)
                phases.leave(engines["ref"])
            for name, spec in teacher_specs(cfg, workdir).items():  # the teacher group's, colocated or not
                engines[f"teacher_{name}"] = build_engine("fsdp2", spec, device)
                phases.leave(engines[f"teacher_{name}"])

        out.append(_measure("load", [], load))
        out[-1].added = [runtime]
        phases.leave(engines["actor"])
        actor = engines["actor"]
        request = TokenRequest(temperature=rollout.temperature, entropy=False)
        update_mb = _micro_batch(rows["actor"], max_len, resp, arch.vocab, actor.hf_config)
        log_prob_mb = _micro_batch(rows["ref"], max_len, resp, arch.vocab, actor.hf_config)

        def sync():
            for _ in actor.rollout_weights():  # the CUDA path: gathered by collectives (a CPU run shares memory instead)
                pass

        def update():
            actor.forward_backward([update_mb], lambda outputs, mb: (outputs["log_probs"].mean(), {}), request)
            actor.optimizer_step()

        with phases.running(actor, "update_actor"):
            # AdamW creates its moments at its first step, so the phases below are measured in the steady state. A zero
            # gradient is enough for that step: a forward and backward there would cost as much as the update measured.
            for p in actor.trained:
                p.grad = torch.zeros_like(p)
            actor.optimizer_step()
        steps = [("sync", "actor", sync, [woken]), ("generate", None, lambda: None, rollout_items),
                 ("old_log_prob", "actor", lambda: actor.forward([log_prob_mb], lambda o, mb: o, request), [])]
        if use_ref:
            steps.append(("ref", "ref", lambda: engines["ref"].forward([log_prob_mb], lambda o, mb: o, request), []))
        for role in (r for r in engines if r.startswith("teacher_")):
            steps.append((role, role, teacher_pass(engines[role], est, cfg, role[len("teacher_"):], arch.vocab), []))
        steps.append(("update_actor", "actor", update, []))
        for phase, role, work, added in steps:
            # a teacher's pass needs what the reference's does (its parameters; rlcore.workers.teacher runs it so)
            with phases.running(engines[role], "ref" if phase.startswith("teacher_") else phase) if role else ExitStack():
                out.append(_measure(phase, _held(engines, "ref" if phase.startswith("teacher_") else phase), work))
            out[-1].added = added + [runtime]
    return Rehearsal(world, capacity, out, notes)


def teacher_specs(cfg: DictConfig, workdir: str) -> dict:
    """The native distillation teachers' EngineSpecs (rlcore.workers.teacher), over config-only model directories."""
    from rlcore.config.distill_schema import teacher_entries
    from rlcore.workers.teacher import teacher_spec

    if not cfg.distillation.enabled:
        return {}
    specs = {}
    for name, teacher in teacher_entries(cfg).items():
        arch, where = resolve_arch(teacher.model_path)
        if arch is None or teacher.inference.name != "native":
            continue  # the plan says why (not estimated; a vLLM teacher allocates for itself)
        teacher.model_path = _model_dir(arch, teacher.model_path, tempfile.mkdtemp(dir=workdir))
        specs[name] = teacher_spec(cfg, teacher, 1)
        specs[name].load_weights, specs[name].use_remove_padding = False, False
    return specs


def teacher_pass(engine, est, cfg: DictConfig, name: str, vocab: int) -> Callable[[], None]:
    """One micro-batch of the teacher's scoring at its planned token budget, with the top-k it returns."""
    from rlcore.config.distill_schema import uses_topk
    from rlcore.engine.base import TokenRequest
    from rlcore.plan.teacher_memory import teacher_phases

    role = next(r for n, r, _ in teacher_phases(est, cfg, _Role, 0, 1, 0)[1] if n == f"teacher {name} scores")
    topk = cfg.distillation.distillation_loss.topk if uses_topk(lambda key: OmegaConf.select(cfg, key)) else 0
    mb = _micro_batch(max(1, role.tokens // est.max_len), est.max_len, est.resp, vocab)
    return lambda: engine.forward([mb], lambda o, m: o, TokenRequest(topk=topk or 0))


def format_rehearsal(rehearsal: Rehearsal, mem: MemoryPlan) -> tuple[str, bool]:
    """The per-phase table beside the plan, and whether every phase fits the device."""
    lines = [f"rehearsal: {note}" for note in rehearsal.notes]
    lines.append(f"rehearsal: {'phase':<13} {'rehearsed':>9} {'plan':>7}  {'diff':>5}  (GiB per rank, {rehearsal.capacity:.0f} GiB device)")
    ok = True
    for phase, (name, peak, planned) in zip(rehearsal.phases, rehearsal.compare(mem)):
        fits = peak <= rehearsal.capacity
        ok &= fits
        diff = f"{100 * (peak - planned) / planned:+4.0f}%" if planned else "    -"
        plan_col = f"{planned:7.1f}" if planned else "      -"
        off = planned and abs(peak - planned) > TOLERANCE * planned
        lines.append(f"rehearsal: {name:<13} {peak:9.1f} {plan_col}  {diff}  {'fits' if fits else 'OOM'}  ({phase.seconds:.0f} s)"
                     + (f"  the plan is off by more than {TOLERANCE:.0%} here" if off else ""))
        kinds = ", ".join(f"{kind} {gib:.2f}" for kind, gib in phase.by_kind.items())
        lines.append(f"rehearsal:   measured {phase.measured:.2f}" + (f" ({kinds})" if kinds else ""))
        for what, gib in phase.added:
            lines.append(f"rehearsal:   + {gib:.2f}  {what}")
    return "\n".join(lines), ok
