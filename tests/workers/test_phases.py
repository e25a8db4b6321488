"""Each phase holds only what it needs (rlcore.workers.phases): the sync streams, then releases the actor, then wakes
the KV cache; the rollout engine is built after the training state left; and the memory ledger, read from the
engines' own account of where their state is, shows it per phase, for FSDP2 and Megatron, offload on and off."""

import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo, spawn_ranks
from grpo_step import family_cfg, grpo_batch, prompts_batch

import rlcore.workers.actor_rollout_ref as arr
from rlcore.engine.megatron.offload import _owners
from rlcore.protocol import DataProto
from rlcore.rollout.base import RolloutEngine
from rlcore.rollout.weight_sync import sync_weights
from rlcore.workers import phases
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

CATEGORIES = ("params", "grads", "optimizer", "rollout_weights", "kv_cache", "transient")


class RecordingRollout(RolloutEngine):
    def __init__(self, calls):
        self.calls = calls

    def generate(self, input_ids, attention_mask, sampling):
        raise AssertionError("not called")

    def update_weights(self, weights):
        self.calls.append(("update", len(list(weights))))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))


class StreamingEngine:
    def rollout_weights(self, bucket_bytes, transient, adapted_only, trainable_only=False):
        return iter([("a", torch.zeros(2)), ("b", torch.zeros(3))])


def test_the_sync_streams_then_releases_the_actor_then_wakes_the_kv_cache():
    calls = []
    stats = {}
    sent = sync_weights(StreamingEngine(), RecordingRollout(calls), release=lambda: calls.append(("release",)), stats=stats)
    assert sent == 2 and stats == {"bytes": 20, "largest": 12}  # two float32 tensors of 2 and 3 elements
    assert calls == [("wake_up", ("weights",)), ("update", 2), ("release",), ("wake_up", ("kv_cache",))]


def gib(metrics: dict, phase: str) -> dict[str, float]:
    return {c: metrics[f"perf/memory/{phase}/{c}_gib"] for c in CATEGORIES if f"perf/memory/{phase}/{c}_gib" in metrics}


def run_step(worker: ActorRolloutRefWorker) -> dict[str, dict[str, float]]:
    """generate -> old log-probs -> reference -> update; each phase's ledger (GiB by category)."""
    prompts = prompts_batch(worker.actor.hf_config.vocab_size)
    out = worker.generate_sequences(prompts)
    ledgers = {"generate": gib(out.meta_info["memory"], "generate")}
    old, ref = worker.compute_log_prob(out), worker.compute_ref_log_prob(out)
    ledgers["old_log_prob"] = gib(old.meta_info["memory"], "old_log_prob")
    ledgers["ref"] = gib(ref.meta_info["memory"], "ref")
    ledgers["update_actor"] = gib(worker.update_actor(grpo_batch(out, worker)), "update_actor")
    return ledgers


OFFLOAD = {
    "fsdp2": ["actor_rollout_ref.actor.fsdp_config.param_offload=True", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
              "actor_rollout_ref.ref.fsdp_config.param_offload=True"],
    "megatron": ["actor_rollout_ref.actor.megatron.param_offload=True", "actor_rollout_ref.actor.megatron.grad_offload=True",
                 "actor_rollout_ref.actor.megatron.optimizer_offload=True", "actor_rollout_ref.ref.megatron.param_offload=True"],
}


def build_worker(backend: str, offload: bool, model_dir, task_dir, out_dir) -> ActorRolloutRefWorker:
    overrides = OFFLOAD[backend] if offload else []
    cfg = family_cfg(model_dir, task_dir, out_dir, *overrides, config_name="ppo_megatron_trainer" if backend == "megatron" else "ppo_trainer")
    worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
    worker.init_model(total_steps=2)
    return worker


def check_ledgers(backend: str, offload: bool, steps: list[dict[str, dict[str, float]]], resident_at_rollout_build) -> None:
    for ledgers in steps:
        gen, old, ref, upd = ledgers["generate"], ledgers["old_log_prob"], ledgers["ref"], ledgers["update_actor"]
        assert gen["kv_cache"] > 0 and gen["rollout_weights"] > 0
        # The sync's bucket as gathered: the whole (tiny) model here, not the 2 GiB the bucket setting allows.
        assert 0 < gen["transient"] <= 1.01 * upd["params"], (gen["transient"], upd["params"])
        assert old["kv_cache"] == ref["kv_cache"] == upd["kv_cache"] == 0  # free_cache_engine: slept after generating
        # ...at level 2: the native engine's own weight copy left too (the next sync refills every weight)
        assert old["rollout_weights"] == ref["rollout_weights"] == upd["rollout_weights"] == 0
        assert upd["params"] > 0 and upd["grads"] > 0 and upd["optimizer"] > 0
        assert old["params"] > 0 and ref["params"] > 0
        if offload:
            # Generation holds rollout weights + KV only; the log-prob passes bring back parameters, nothing else.
            assert gen["params"] == gen["grads"] == gen["optimizer"] == 0, gen
            for phase in (old, ref):
                assert phase["grads"] == phase["optimizer"] == 0, phase
            assert "params" not in resident_at_rollout_build
        elif backend == "megatron":  # nothing offloaded: the grad buffer and (after a step) AdamW stay resident
            assert gen["params"] > 0 and gen["grads"] > 0
        else:  # FSDP2 frees gradients at every step, whatever the flags
            assert gen["params"] > 0 and gen["grads"] == 0 and old["grads"] == 0
    first, second = steps
    assert (second["generate"]["optimizer"] > 0) != offload  # resident between steps unless optimizer_offload
    if backend == "fsdp2":  # torch's AdamW allocates its moments at the first step (Megatron's optimizer at build)
        assert first["generate"]["optimizer"] == 0


@pytest.mark.parametrize("offload", [True, False], ids=["offload", "resident"])
def test_fsdp2_phases_hold_what_they_need(offload, tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch):
    init_gloo(0, 1, free_port())
    seen = []  # the actor's resident state when the rollout engine is built
    real = arr.build_rollout_parts
    original_init = ActorRolloutRefWorker.init_model

    def init_model(self, total_steps):
        monkeypatch.setattr(arr, "build_rollout_parts", lambda *a: (seen.append(self.actor.resident), real(*a))[1])
        original_init(self, total_steps)

    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", init_model)
    worker = build_worker("fsdp2", offload, tiny_model_dir, tiny_task_dir, tmp_path)
    steps = [run_step(worker), run_step(worker)]
    check_ledgers("fsdp2", offload, steps, seen[0])
    assert worker.actor.resident == ({"grads"} if offload else {"params", "grads", "optimizer"})


def _megatron_phases(rank, port, model_dir, task_dir, out_dir, offload):
    init_gloo(rank, 1, port)
    seen = []
    real = arr.build_rollout_parts
    original_init = ActorRolloutRefWorker.init_model

    def init_model(self, total_steps):
        arr.build_rollout_parts = lambda *a: (seen.append(self.actor.resident), real(*a))[1]
        original_init(self, total_steps)

    ActorRolloutRefWorker.init_model = init_model  # a spawned process of its own: nothing to restore
    worker = build_worker("megatron", offload, model_dir, task_dir, out_dir)
    steps = [run_step(worker), run_step(worker)]
    check_ledgers("megatron", offload, steps, seen[0])
    assert worker.actor.resident == (frozenset() if offload else {"params", "grads", "optimizer"})
    # The ledger counts an fp32 model's AdamW moments, two per parameter, not the parameters a second time...
    sizes = worker.actor.state_bytes()
    assert sizes["optimizer"] == pytest.approx(2 * sizes["params"], rel=0.01), sizes  # the DDP buffer pads the parameters
    # ...and the device really lets them go (each storage's bytes, not the engine's account): parameters brought
    # back alone leave again, although the optimizer that steps them is offloaded (they stayed, on an H200).
    phases.enter(worker.actor, "old_log_prob")
    phases.leave(worker.actor)
    held = sum(t.untyped_storage().nbytes() for t in _owners(worker.actor, params=True, grads=True, optimizer=True))
    assert (held == 0) if offload else held >= sum(sizes.values())
    close_gloo()


@pytest.mark.parametrize("offload", [True, False], ids=["offload", "resident"])
def test_megatron_phases_hold_what_they_need(offload, tiny_model_dir, tiny_task_dir, tmp_path):
    spawn_ranks(_megatron_phases, 1, lambda port: (port, tiny_model_dir, tiny_task_dir, str(tmp_path), offload))


class BucketedActor:
    """Two 1 MiB float32 weights; records the bucket size the worker asks it to gather by."""

    class spec:
        lora = None
        freeze_vision_tower = False

    def __init__(self):
        self.buckets = []

    def rollout_weights(self, bucket_bytes, transient, adapted_only, trainable_only=False):
        self.buckets.append(bucket_bytes)
        return iter([("a", torch.zeros(2**18)), ("b", torch.zeros(2**18))])


class SleepingRollout(RecordingRollout):
    keeps_weights = False

    def sleep(self, level=2):
        self.calls.append(("sleep", level))


def test_bucket_megabytes_sizes_the_sync_and_free_cache_engine_sleeps_the_rollout_after_generating(monkeypatch):
    """actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes reaches the actor's gather (and the
    generate phase's ledger counts the bucket it really held); free_cache_engine puts the rollout to sleep after."""
    from rlcore.config import compose

    transient = []
    monkeypatch.setattr(phases, "enter", lambda engine, phase: None)
    monkeypatch.setattr(phases, "leave", lambda engine: None)
    monkeypatch.setattr(phases, "ledger", lambda phase, engines, rollout, transient_bytes=0, device=None: transient.append(transient_bytes) or {})
    monkeypatch.setattr(arr, "sampling_params", lambda *args: None)
    monkeypatch.setattr(arr, "generate", lambda rollout, loop, prompts, sampling: (DataProto.from_dict({"responses": torch.zeros(1, 1)}), {}))

    def generate(*overrides):
        worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
        worker.config = compose(["recipe=tiny_cpu", *overrides])
        worker.actor, worker.ref, worker.rollout, worker.agent_loop = BucketedActor(), None, SleepingRollout([]), None
        worker.tokenizer, worker.device_type, worker._rollout_has_base, worker._unmerged_lora = None, "cpu", False, False
        worker._rollout_has_tower = False
        worker.generate_sequences(DataProto.from_dict({"input_ids": torch.zeros(1, 1)}))
        return worker.actor.buckets, worker.rollout.calls

    key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    buckets, calls = generate(f"{key}=1", "actor_rollout_ref.rollout.free_cache_engine=True")
    assert buckets == [2**20] and transient[-1] == 2**20  # a 1 MiB bucket: one weight per gather
    assert calls[-1] == ("sleep", 2)  # the KV cache and the rollout's weights leave once the samples are made
    buckets, calls = generate(f"{key}=4", "actor_rollout_ref.rollout.free_cache_engine=False")
    assert buckets == [4 * 2**20] and transient[-1] == 2 * 2**20  # a 4 MiB bucket holds the whole 2 MiB model
    assert not any(call[0] == "sleep" for call in calls)  # the rollout stays awake
