"""Split-pool keys as verl's fully-async recipe writes them: the sizes it leaves to be derived, the rules, the
staleness window, and its 4+4 GPU command line composing, validating and planning on two pools."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlcore.config import compose
from rlcore.config.async_schema import always_fresh, async_warnings, derive_async_sizes, staleness_window
from rlcore.config.validate import diagnose
from rlcore.plan import memory_plan
from rlcore.plan.run_plan import on_policy

ARR = "actor_rollout_ref"
SPLIT = [f"{ARR}.hybrid_engine=False", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"]
VERL_4_4 = Path(__file__).parents[1] / "e2e" / "verl_fully_async_dapo_7b_4_4.args"


def _errors(*overrides):
    return diagnose(compose(["recipe=tiny_cpu", *SPLIT, *overrides]))[1]


def _get(cfg):
    return lambda key: OmegaConf.select(cfg, key)


def test_the_tiny_recipe_on_split_pools_validates():
    assert _errors() == []


@pytest.mark.parametrize("threshold, trigger, window", [(0, 1, 1), (1, 1, 2), (0.1, 4, 4), (0.5, 4, 6), (1, 32, 64)])
def test_staleness_window_in_trainer_steps(threshold, trigger, window):
    cfg = compose(["recipe=tiny_cpu", *SPLIT, f"async_training.staleness_threshold={threshold}",
                   f"async_training.trigger_parameter_sync_step={trigger}"])
    assert staleness_window(_get(cfg)) == window


def test_only_staleness_zero_with_a_sync_every_step_and_no_partial_rollouts_is_always_fresh():
    fresh = ["async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=False"]
    assert always_fresh(_get(compose(["recipe=tiny_cpu", *SPLIT, *fresh])))
    for changed in ("async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=2", "async_training.partial_rollout=True"):
        assert not always_fresh(_get(compose(["recipe=tiny_cpu", *SPLIT, *fresh, changed])))


@pytest.mark.parametrize("overrides, fragment", [
    (["data.train_batch_size=16"], "a trainer step consumes async_training.require_batches=1 x actor_rollout_ref.actor.ppo_mini_batch_size=32 "
                                   "= 32 prompts; use data.train_batch_size=32"),
    (["data.gen_batch_size=5"], "data.gen_batch_size=5 (prompts per rollout call) must divide data.train_batch_size=32"),
    (["async_training.staleness_threshold=-1"], "async_training.staleness_threshold=-1.0 must be >= 0"),
    (["async_training.trigger_parameter_sync_step=0"], "async_training.trigger_parameter_sync_step=0 must be >= 1"),
    (["rollout.n_gpus_per_node=0"], "rollout.n_gpus_per_node=0 must be >= 1"),
    (["rollout.n=4"], "rollout.n=4 differs from actor_rollout_ref.rollout.n=8"),
    (["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"], "algorithm.filter_groups (dynamic sampling) with"),
    ([f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=2"],
     f"{ARR}.rollout.tensor_model_parallel_size=2 must divide rollout.n_gpus_per_node=1"),
])
def test_each_rule_names_the_key_and_a_fix(overrides, fragment):
    errors = _errors(*overrides)
    assert any(fragment in e for e in errors), errors


def test_train_batch_size_zero_is_derived_as_verl_does():
    cfg = compose(["recipe=tiny_cpu", *SPLIT, "data.train_batch_size=0", "async_training.require_batches=2",
                   f"{ARR}.actor.ppo_mini_batch_size=8", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8", "data.gen_batch_size=1",
                   "rollout.total_rollout_steps=160", "trainer.total_training_steps=null"])
    plan, errors = diagnose(cfg)
    assert errors == [] and cfg.data.train_batch_size == 16 and plan.prompts_per_step == 16
    assert cfg.trainer.total_training_steps == 10  # 160 prompts / 16 per step


def test_diagnose_reports_and_never_writes_the_config():
    """The sizes are derived once, as the config is composed; diagnose() only reads, so a config that skipped that
    step is reported (not silently repaired) and comes back as it went in."""
    from omegaconf import OmegaConf

    from rlcore.config.schema import PPOConfig

    cfg = OmegaConf.structured(PPOConfig())
    for key, value in (("actor_rollout_ref.hybrid_engine", False), ("data.train_batch_size", 0), ("async_training.require_batches", 2),
                       (f"{ARR}.actor.ppo_mini_batch_size", 8), ("rollout.test_freq", 2), ("async_training.trigger_parameter_sync_step", 4)):
        OmegaConf.update(cfg, key, value)
    before = OmegaConf.to_container(cfg)
    _, errors = diagnose(cfg)
    assert OmegaConf.to_container(cfg) == before
    assert any("data.train_batch_size" in e for e in errors), errors
    derive_async_sizes(cfg)
    assert cfg.data.train_batch_size == 16 and cfg.trainer.test_freq == 8
    derive_async_sizes(cfg)  # once or twice: the same sizes
    assert cfg.data.train_batch_size == 16 and cfg.trainer.test_freq == 8


def test_rollout_total_epochs_and_test_freq_set_the_trainers_on_split_pools():
    def derived(*overrides, split=SPLIT):
        cfg = compose(["recipe=tiny_cpu", *split, "trainer.total_epochs=1", "trainer.test_freq=5", *overrides])
        derive_async_sizes(cfg)
        return cfg.trainer.total_epochs, cfg.trainer.test_freq

    assert derived() == (1, 5)  # unset: the trainer's own
    assert derived("rollout.total_epochs=3") == (3, 5)
    # verl counts rollout.test_freq in weight syncs: a validation every 2 syncs of 4 trainer steps each
    assert derived("rollout.test_freq=2", "async_training.trigger_parameter_sync_step=4") == (1, 8)
    assert derived("rollout.test_freq=-1") == (1, 5)  # off: trainer.test_freq stands
    assert derived("rollout.total_epochs=3", "rollout.test_freq=2", split=[]) == (1, 5)  # the hybrid engine ignores rollout.*


def test_verl_fully_async_4_4_command_line_composes_validates_and_plans_two_pools():
    script = [line for line in VERL_4_4.read_text().splitlines() if line and not line.startswith("#")]
    cfg = compose(script)
    plan, errors = diagnose(cfg)
    assert errors == [], errors
    assert cfg.data.train_batch_size == 64 and cfg.trainer.total_training_steps == 1280 and cfg.trainer.total_epochs == 10
    assert plan.world_size == 8 and plan.dp_size == 8  # the trainer's pool: 2 nodes x 4
    mem = memory_plan(cfg, plan)
    roles = {r.role: r for r in mem.roles}
    assert roles["rollout"].where == "8 devices, own pool" and roles["actor update"].where.endswith("own pool")
    rollout_items = dict(roles["rollout"].items)
    assert "rollout engine asleep" not in dict(roles["actor update"].items)  # nothing of the rollout on the trainer's devices
    assert not any("state kept between phases" in k for k in rollout_items)  # nothing of training's on the rollout's
    assert all(r.verdict == "fits" for r in mem.roles), {r.role: (r.verdict, r.peak) for r in mem.roles}


def test_partial_rollout_is_named_where_the_engine_cannot_interrupt():
    """The native engine parks at a sync and resumes (partial rollouts); vLLM's runs each call to its end."""
    assert async_warnings(_get(compose(["recipe=tiny_cpu"]))) == []  # the hybrid engine: nothing to say
    assert async_warnings(_get(compose(["recipe=tiny_cpu", *SPLIT, "data.gen_batch_size=8"]))) == []  # native: it interrupts
    vllm = [*SPLIT, "actor_rollout_ref.rollout.name=vllm", "data.gen_batch_size=8"]
    assert async_warnings(_get(compose(["recipe=tiny_cpu", *vllm, "async_training.partial_rollout=False"]))) == []
    (warning,) = async_warnings(_get(compose(["recipe=tiny_cpu", *vllm])))
    assert "partial_rollout=True with rollout.name=vllm" in warning and "data.gen_batch_size=8 prompts" in warning


V09 = ["trainer.v1.trainer_mode=separate_async", f"{ARR}.rollout.nnodes=1", f"{ARR}.rollout.n_gpus_per_node=1",
       "trainer.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=2", f"{ARR}.actor.ppo_mini_batch_size=16"]


def test_verl_0_9s_separate_async_mode_is_split_pools_with_its_bound_and_sync_rule():
    """trainer.v1.trainer_mode=separate_async: the rollout on actor_rollout_ref.rollout.nnodes x n_gpus_per_node devices,
    a step of parameter_sync_step mini-batches (verl's rule train_batch_size = parameter_sync_step x ppo_mini_batch_size)
    with one weight sync after it, partial rollouts, and the rollout at most max_off_policy_threshold - 1 steps ahead
    (the drop strategy's part: tests/trainer/test_split_pools.py)."""
    cfg = compose(["recipe=tiny_cpu", *V09, "trainer.v1.sampler.max_off_policy_threshold=3"])
    get = _get(cfg)
    assert cfg.actor_rollout_ref.hybrid_engine is False and (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node) == (1, 1)
    assert (cfg.async_training.require_batches, cfg.async_training.trigger_parameter_sync_step) == (2, 1)
    assert cfg.data.train_batch_size == 2 * 16 and cfg.async_training.partial_rollout and staleness_window(get) == 3
    assert diagnose(cfg)[1] == []
    # verl's own asserts, and what rlcore does not do
    assert _errors(*V09[:1], "trainer.v1.separate_async.hybrid_rollout.enable_switch=True") == [
        f"trainer.v1.separate_async.hybrid_rollout.enable_switch=True (lending the trainer's idle devices to the rollout) "
        "is not supported by rlcore; drop it (the rollout keeps its own devices)",
        f"trainer.v1.trainer_mode=separate_async runs the rollout on devices of its own: set {ARR}.rollout.nnodes (>= 1) and "
        f"{ARR}.rollout.n_gpus_per_node (verl asserts the same)",
        f"data.train_batch_size=32: with {ARR}.hybrid_engine=False a trainer step consumes trainer.v1.separate_async."
        f"parameter_sync_step=4 x {ARR}.actor.ppo_mini_batch_size=32 = 128 prompts; use data.train_batch_size=128"]
    mixed = diagnose(compose(["recipe=tiny_cpu", *V09, "async_training.trigger_parameter_sync_step=2"]))[1]
    assert [e.split(" and ")[0] for e in mixed] == ["async_training.trigger_parameter_sync_step=2"]
    sync = compose(["recipe=tiny_cpu", "trainer.v1.trainer_mode=sync", "trainer.use_v1=False"])
    assert sync.actor_rollout_ref.hybrid_engine is True and diagnose(sync)[1] == []


def test_verl_0_9_colocate_async_runs_on_the_hybrid_engine_and_says_what_it_cannot_carry():
    """trainer_mode=colocate_async is the hybrid loop with samples carried across steps (rlcore.rollout.partial):
    never on-policy; refused where a sample cannot be carried (vLLM's calls run to their end, agent loops, R3's
    routes), with the split pools' key, and where wait could not keep its bound."""
    mode = "trainer.v1.trainer_mode=colocate_async"
    cfg = compose(["recipe=tiny_cpu", mode])
    assert cfg.actor_rollout_ref.hybrid_engine is True and diagnose(cfg)[1] == [] and not on_policy(cfg)
    first = lambda *o: [e.split(":")[0] for e in diagnose(compose(["recipe=tiny_cpu", mode, *o]))[1]]  # noqa: E731
    assert f"{mode} with {ARR}.rollout.name=vllm" in first(f"{ARR}.rollout.name=vllm")
    assert f"{mode} with multi-turn or agent rollouts ({ARR}.rollout.multi_turn.enable) is not supported yet" in first(
        f"{ARR}.rollout.multi_turn.enable=True")
    assert f"{mode} with {ARR}.actor.router_replay.mode=R3" in first(f"{ARR}.actor.router_replay.mode=R3")
    assert f"{mode} with algorithm.filter_groups.enable=True is not supported yet" in first("algorithm.filter_groups.enable=True")
    assert f"data.train_batch_size=33 with {mode}" in first("data.train_batch_size=33", f"{ARR}.actor.ppo_mini_batch_size=33")
    assert first("trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=2",
                 "trainer.v1.colocate_async.num_warmup_batches=2") == [
        "trainer.v1.colocate_async.num_warmup_batches=2 with max_off_policy_strategy=wait and max_off_policy_threshold=2"]
    assert first("trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=2") == []
