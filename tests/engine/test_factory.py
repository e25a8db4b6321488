"""rlcore/engine/factory.py::engine_spec: each role's verl-style keys reach the EngineSpec (and the megatron dict) the
engines are built from. Each test composes the config with the key set, builds the spec exactly as the role's worker
does, and checks the field the engine reads; the engine test named in each comment shows what that field does."""

import dataclasses

import pytest
import torch

from rlcore.config import compose
from rlcore.config.validate import diagnose
from rlcore.engine.factory import engine_spec
from rlcore.engine.megatron.model import Layout
from rlcore.engine.optim import lr_factor
from rlcore.models.hf import to_torch_dtype
from rlcore.train_rm import compose_rm
from rlcore.train_sft import compose_sft

ARR = "actor_rollout_ref"
TOTAL_STEPS = 40


def _ppo(overrides):
    return compose(["recipe=tiny_cpu", *overrides])


# role -> (the role's key prefix, its config, the spec its worker builds), each call as in the worker's init_model
ROLES = {
    "actor": (f"{ARR}.actor.", f"{ARR}.model.", _ppo, lambda c: engine_spec(
        c.actor_rollout_ref.actor.strategy, c.actor_rollout_ref.model, c.actor_rollout_ref.actor, c.actor_rollout_ref.actor.optim,
        c.actor_rollout_ref.actor.grad_clip, TOTAL_STEPS)),  # rlcore/workers/actor_rollout_ref.py
    "ref": (f"{ARR}.ref.", f"{ARR}.model.", _ppo, lambda c: engine_spec(
        c.actor_rollout_ref.ref.strategy, c.actor_rollout_ref.model, c.actor_rollout_ref.ref, None, 0.0, TOTAL_STEPS)),
    "critic": ("critic.", "critic.model.", _ppo, lambda c: engine_spec(
        c.critic.strategy, c.critic.model, c.critic, c.critic.optim, c.critic.grad_clip, TOTAL_STEPS, kind="value")),
    "reward_model": ("reward_model.", "reward_model.model.", _ppo, lambda c: engine_spec(
        c.reward_model.strategy, c.reward_model.model, c.reward_model, None, 0.0, TOTAL_STEPS, kind="reward",
        model_path=c.reward.reward_model.model_path)),  # rlcore/workers/reward_model.py
    "sft": ("", "model.", compose_sft, lambda c: engine_spec(
        c.model.strategy, c.model, c.model, c.optim, c.optim.clip_grad, TOTAL_STEPS)),  # rlcore/workers/sft_trainer.py
    "rm": ("", "model.", compose_rm, lambda c: engine_spec(
        c.model.strategy, c.model, c.model, c.optim, c.optim.clip_grad, TOTAL_STEPS, kind="reward")),
}
TRAINED = ["actor", "critic", "sft", "rm"]
# where each trained role's optim section lives
OPTIM = {"actor": f"{ARR}.actor.optim.", "critic": "critic.optim.", "sft": "optim.", "rm": "optim."}
# where each role's fsdp_config lives (the actor's and reference's in their section, the others' in their model's)
FSDP = {"actor": f"{ARR}.actor.fsdp_config.", "ref": f"{ARR}.ref.fsdp_config.", "critic": "critic.model.fsdp_config.",
        "reward_model": "reward_model.model.fsdp_config.", "sft": "model.fsdp_config.", "rm": "model.fsdp_config."}
MEGATRON_ROLES = ["actor", "ref", "critic"]


def spec_of(role: str, overrides=()):
    _, _, compose_fn, build = ROLES[role]
    return build(compose_fn(list(overrides)))


# What the schedule fields do: tests/engine/test_fsdp2_features.py::test_warmup_then_constant_and_cosine (both engines
# read them through rlcore/engine/optim.py::lr_factor, asserted here too).
@pytest.mark.parametrize("role", TRAINED)
def test_lr_warmup_steps_and_ratio_set_the_warmup(role):
    optim = OPTIM[role]
    spec = spec_of(role, [f"{optim}lr_warmup_steps=5"])
    assert spec.warmup_steps == 5 and spec.total_steps == TOTAL_STEPS
    assert lr_factor(0, spec.warmup_steps, spec.total_steps, spec.lr_scheduler_type, 0.0, 0.5) == pytest.approx(1 / 5)
    # lr_warmup_steps=-1 hands the warmup to lr_warmup_steps_ratio, a fraction of the run's optimizer steps (verl's rule)
    spec = spec_of(role, [f"{optim}lr_warmup_steps=-1", f"{optim}lr_warmup_steps_ratio=0.25"])
    assert spec.warmup_steps == TOTAL_STEPS // 4
    assert spec_of(role, [f"{optim}lr_warmup_steps=-1", f"{optim}lr_warmup_steps_ratio=0.0"]).warmup_steps == 0


@pytest.mark.parametrize("role", TRAINED)
def test_lr_scheduler_type_picks_the_decay(role):
    optim = OPTIM[role]
    common = [f"{optim}lr_warmup_steps=0", f"{optim}min_lr_ratio=0.0"]
    constant, cosine = (spec_of(role, [*common, f"{optim}lr_scheduler_type={kind}"]) for kind in ("constant", "cosine"))
    assert (constant.lr_scheduler_type, cosine.lr_scheduler_type) == ("constant", "cosine")
    halfway = TOTAL_STEPS // 2 - 1  # the update (0-based) that is the schedule's step TOTAL_STEPS // 2
    factor = lambda s: lr_factor(halfway, s.warmup_steps, s.total_steps, s.lr_scheduler_type, s.min_lr_ratio, s.num_cycles)  # noqa: E731
    assert factor(constant) == 1.0 and factor(cosine) == pytest.approx(0.5)


# verl's Megatron optim names the schedule lr_decay_style; set, it is the schedule (both engines read spec.lr_scheduler_type).
@pytest.mark.parametrize("role", TRAINED)
def test_lr_decay_style_is_verls_megatron_name_for_the_schedule(role):
    optim = OPTIM[role]
    common = [f"{optim}lr_warmup_steps=4", f"{optim}min_lr_ratio=0.1"]
    specs = {kind: spec_of(role, [*common, f"{optim}lr_decay_style={kind}"]) for kind in ("linear", "inverse_square_root", "cosine")}
    assert {kind: s.lr_scheduler_type for kind, s in specs.items()} == {kind: kind for kind in specs}
    factor = lambda s, step: lr_factor(step, s.warmup_steps, s.total_steps, s.lr_scheduler_type, s.min_lr_ratio, s.num_cycles)  # noqa: E731
    # linear: from 1 after warmup down to min_lr_ratio at the end, halfway at the middle of the decay (the first update
    # is the schedule's step 1: update k, 0-based, is step k + 1)
    assert factor(specs["linear"], 3) == 1.0 and factor(specs["linear"], 3 + (TOTAL_STEPS - 4) // 2) == pytest.approx(0.55)
    assert factor(specs["linear"], TOTAL_STEPS - 1) == pytest.approx(0.1)
    # megatron-core's inverse square root: sqrt(warmup / steps so far), floored at min_lr_ratio
    assert factor(specs["inverse_square_root"], 15) == pytest.approx(0.5) and factor(specs["inverse_square_root"], 10_000) == 0.1


# verl's FSDP optim once named it warmup_style (deprecated there for lr_scheduler_type; its newer SFT scripts still set it).
@pytest.mark.parametrize("role", TRAINED)
def test_warmup_style_is_verls_older_name_for_the_schedule(role):
    optim = OPTIM[role]
    assert spec_of(role, [f"{optim}warmup_style=cosine"]).lr_scheduler_type == "cosine"
    assert spec_of(role, []).lr_scheduler_type == "constant"


# optim.override_optimizer_config: extra optimizer arguments, verl's way. What they do: the FSDP2 engine's AdamW
# (tests/engine/test_fsdp2_features.py::test_override_optimizer_config_reaches_adamw), megatron-core's OptimizerConfig
# (tests/engine/test_megatron_features.py::test_override_optimizer_config_reaches_megatron_cores_optimizer).
def test_megatrons_hybrid_cpu_optimizer_is_not_offloaded_again_between_phases():
    """verl's Megatron scripts set optimizer_cpu_offload (state on the host, megatron-core's hybrid optimizer) and
    megatron.optimizer_offload together; the engine then has no optimizer state to move between phases."""
    megatron = [f"{ARR}.actor.strategy=megatron", f"{ARR}.actor.megatron.optimizer_offload=True"]
    assert spec_of("actor", megatron).optimizer_offload
    assert spec_of("actor", megatron).fsdp is None and spec_of("actor").megatron is None  # one backend part each
    hybrid = spec_of("actor", [*megatron, f"+{ARR}.actor.optim.override_optimizer_config.optimizer_cpu_offload=True"])
    assert not hybrid.optimizer_offload and hybrid.optimizer_overrides == {"optimizer_cpu_offload": True}


@pytest.mark.parametrize("role", TRAINED)
def test_verl_0_9s_schedule_keys_reach_the_spec(role):
    """optim.zero_indexed_step (verl 0.9) and verl's Megatron optim keys, in lr units: min_lr (the decay's floor),
    lr_warmup_init (the warmup's start), lr_decay_steps (the decay's length)."""
    o = OPTIM[role]
    spec = spec_of(role, [f"{o}lr=1e-5", f"{o}min_lr=1e-6", f"{o}lr_warmup_init=2e-6", f"{o}lr_decay_steps=25",
                          f"{o}zero_indexed_step=True"])
    assert (spec.min_lr_ratio, spec.warmup_init_ratio, spec.total_steps, spec.zero_indexed_step) == (pytest.approx(0.1), pytest.approx(0.2), 25, True)
    default = spec_of(role)
    assert (default.total_steps, default.warmup_init_ratio, default.zero_indexed_step) == (TOTAL_STEPS, 0.0, False)


@pytest.mark.parametrize("role", MEGATRON_ROLES)
def test_verl_0_9s_model_engine_group_puts_every_trained_role_on_megatron(role):
    """`model_engine=megatron` (verl 0.9's group; 0.8's `--config-name ppo_megatron_trainer`): the role's worker builds
    a Megatron spec from its megatron section, and verl 0.9's Megatron optimizer options reach megatron-core."""
    spec = spec_of(role, ["model_engine=megatron", "algorithm.adv_estimator=gae"])
    assert spec.megatron is not None and spec.fsdp is None
    assert spec_of(role, ["model_engine=dp", "algorithm.adv_estimator=gae"]).megatron is None
    if role in TRAINED:
        options = [f"+{OPTIM[role]}override_optimizer_config.{k}=True" for k in ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d")]
        cfg = _ppo(["model_engine=megatron", "algorithm.adv_estimator=gae", *options])
        assert not [e for e in diagnose(cfg)[1] if "override_optimizer_config" in e and "needs CUDA" not in e]
        assert ROLES[role][3](cfg).optimizer_overrides == {"optimizer_cpu_offload": True, "overlap_cpu_optimizer_d2h_h2d": True}


@pytest.mark.parametrize("role", TRAINED)
def test_override_optimizer_config_reaches_the_spec(role):
    spec = spec_of(role, [f"+{OPTIM[role]}override_optimizer_config.eps=0.001", f"+{OPTIM[role]}override_optimizer_config.amsgrad=True"])
    assert spec.optimizer_overrides == {"eps": 0.001, "amsgrad": True}
    assert spec_of(role).optimizer_overrides == {}


# The SFT and reward-model trainers clip with optim.clip_grad (verl's sft key), the PPO roles with their grad_clip.
# What grad_clip does in the engine: tests/engine/test_fsdp2_features.py::test_optimizer_step_is_clipped_decoupled_adamw_by_hand
@pytest.mark.parametrize("role", ["sft", "rm"])
def test_clip_grad_sets_the_trainers_gradient_clip(role):
    assert spec_of(role, ["optim.clip_grad=0.25"]).grad_clip == 0.25
    assert spec_of(role, ["optim.clip_grad=3.0"]).grad_clip == 3.0


# verl's actor and critic have both keys: grad_clip (its worker's) and optim.clip_grad (its newer engine's); the one
# moved from the shared default of 1.0 is meant, and two different settings are refused (rlcore/config/fsdp_schema.py).
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_optim_clip_grad_sets_the_clip_unless_grad_clip_does(role):
    section = "actor_rollout_ref.actor." if role == "actor" else "critic."
    assert spec_of(role, [f"{section}optim.clip_grad=0.25"]).grad_clip == 0.25
    assert spec_of(role, [f"{section}grad_clip=0.5"]).grad_clip == 0.5
    assert spec_of(role, [f"{section}grad_clip=0.5", f"{section}optim.clip_grad=0.5"]).grad_clip == 0.5
    _, errors = diagnose(compose(["algorithm.adv_estimator=gae", f"{section}grad_clip=0.5", f"{section}optim.clip_grad=0.25"]))
    assert any(f"{section}grad_clip=0.5 and {section}optim.clip_grad=0.25 both set" in e for e in errors), errors


# What the adapters on these modules do: tests/engine/test_fsdp2_lora.py::test_only_adapters_train_and_the_reference_is_the_base
@pytest.mark.parametrize("role", TRAINED)
def test_target_modules_name_the_lora_adapted_modules(role):
    model = ROLES[role][1]
    spec = spec_of(role, [f"{model}lora_rank=4", f"{model}target_modules=[q_proj,v_proj]"])
    assert spec.lora.target_modules == ("q_proj", "v_proj")
    assert spec_of(role, [f"{model}lora_rank=4", f"{model}target_modules=all-linear"]).lora.target_modules == "all-linear"


def _fully_shard_kwargs(spec, monkeypatch) -> list[dict]:
    """The kwargs FSDP2Engine's apply_fsdp2 hands torch's fully_shard for this spec, one dict per unit (a spy
    stands in for fully_shard: no process group needed)."""
    from rlcore.engine import fsdp2

    calls = []
    monkeypatch.setattr(fsdp2, "fully_shard", lambda module, **kwargs: calls.append(kwargs))
    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    spec.gradient_checkpointing = False  # a plain module has no HF checkpointing switch
    fsdp2.apply_fsdp2(torch.nn.Sequential(*blocks), blocks, None, spec)
    assert len(calls) == 3  # each block, then the root
    return calls


# No engine test shows these two on CPU (one rank: nothing to reshard, no device to offload from); what they do is
# torch's (fully_shard's reshard_after_forward and CPUOffloadPolicy), and tests/plan/test_memory.py counts the device
# memory each one saves. Here: every unit's fully_shard call gets them.
@pytest.mark.parametrize("role", list(FSDP))
def test_offload_policy_and_reshard_after_forward_reach_fully_shard(role, monkeypatch):
    from torch.distributed.fsdp import CPUOffloadPolicy

    fsdp = FSDP[role]
    for kwargs in _fully_shard_kwargs(spec_of(role), monkeypatch):
        assert kwargs["reshard_after_forward"] is True and "offload_policy" not in kwargs
    for kwargs in _fully_shard_kwargs(spec_of(role, [f"{fsdp}offload_policy=True", f"{fsdp}reshard_after_forward=False"]), monkeypatch):
        assert kwargs["reshard_after_forward"] is False and isinstance(kwargs["offload_policy"], CPUOffloadPolicy)


# verl's newer SFT trainer (verl.trainer.sft_trainer) names the FSDP knobs engine.*, its older one model.fsdp_config.*:
# SFT's model.fsdp_config follows engine.*, so either key sets what the engine reads. What each field does:
# the fsdp_config lines of tests/config/wired_keys.txt.
def test_verls_sft_engine_section_sets_the_sft_engine():
    cfg = compose_sft(["engine=fsdp", "optim=fsdp", "engine.strategy=fsdp2", "engine.fsdp_size=1", "engine.ulysses_sequence_parallel_size=2",
                       "engine.param_offload=True", "engine.optimizer_offload=True", "engine.offload_policy=True",
                       "engine.reshard_after_forward=False", "engine.forward_prefetch=True", "engine.model_dtype=bf16",
                       "engine.dtype=float32", "engine.wrap_policy.min_num_params=1000", "engine.use_torch_compile=False"])
    spec = engine_spec(cfg.model.strategy, cfg.model, cfg.model, cfg.optim, cfg.optim.clip_grad, TOTAL_STEPS)
    assert cfg.model.strategy == "fsdp2" and cfg.ulysses_sequence_parallel_size == 2 and spec.ulysses_sp == 2
    assert (spec.fsdp.fsdp_size, spec.param_offload, spec.optimizer_offload, spec.fsdp.offload_policy) == (1, True, True, True)
    assert (spec.fsdp.reshard_after_forward, spec.fsdp.forward_prefetch, spec.model_dtype, spec.param_dtype) == (False, True, "bf16", "float32")
    assert (spec.fsdp.wrap_min_params, spec.fsdp.use_torch_compile) == (1000, False)
    older = compose_sft(["model.fsdp_config.fsdp_size=1"])  # verl's fsdp_sft_trainer key still sets it
    assert engine_spec(older.model.strategy, older.model, older.model, older.optim, 1.0, TOTAL_STEPS).fsdp.fsdp_size == 1


# LoRA's two key sets: verl's Megatron section (model.lora.*: what the adapters do, tests/engine/test_megatron_lora.py)
# and its FSDP keys, model.exclude_modules included (peft's exclude_modules: below).
def test_megatron_lora_section_and_fsdp_exclude_modules_reach_the_spec(tiny_model_dir):
    from rlcore.models.lora import LoraSpec, apply_lora

    section = [f"{ARR}.actor.strategy=megatron", f"{ARR}.model.lora.rank=8", f"{ARR}.model.lora.alpha=16",
               f"{ARR}.model.lora.lora_A_init_method=kaiming"]
    assert spec_of("actor", [*section, f"{ARR}.model.lora.target_modules=[linear_qkv]"]).lora == LoraSpec(
        8, 16, ("linear_qkv",), None, None, "kaiming")
    excluding = spec_of("actor", [*section, f"{ARR}.model.lora.target_modules=[]", f"{ARR}.model.lora.exclude_modules=[linear_fc2]"])
    assert excluding.lora.exclude_modules == ("linear_fc2",) and excluding.lora.target_modules == ()
    fsdp = spec_of("actor", [f"{ARR}.model.lora_rank=8", f"{ARR}.model.exclude_modules=.*layers\\.0\\..*"])
    assert fsdp.lora.exclude_modules == ".*layers\\.0\\..*"
    # verl 0.9's critic.model.exclude_modules: the critic's adapters too
    critic = spec_of("critic", ["algorithm.adv_estimator=gae", "critic.model.lora_rank=8", "critic.model.exclude_modules=[o_proj]"])
    assert critic.lora.exclude_modules == ("o_proj",)
    from rlcore.models.hf import load_causal_lm

    adapted = {n.split(".lora_A")[0] for n, _ in apply_lora(load_causal_lm(tiny_model_dir), fsdp.lora).named_parameters() if "lora_A" in n}
    assert adapted and not any(".layers.0." in n for n in adapted) and any(".layers.1." in n for n in adapted)


# verl's FSDP mixed-precision dict (verl's scripts add it with "+", which rlcore's command line takes as a plain
# override): param_dtype wins over dtype, reduce_dtype is the dtype FSDP2 reduces gradients in. What FSDP2 does with
# them is torch's (MixedPrecisionPolicy); the memory plan
# computes in the same dtype (rlcore/config/fsdp_schema.py::compute_dtype).
@pytest.mark.parametrize("role", [r for r in FSDP if r != "reward_model"])
def test_mixed_precision_param_and_reduce_dtypes_reach_fully_shard(role, monkeypatch):
    fsdp = FSDP[role]
    for kwargs in _fully_shard_kwargs(spec_of(role, [f"{fsdp}dtype=bfloat16"]), monkeypatch):
        assert (kwargs["mp_policy"].param_dtype, kwargs["mp_policy"].reduce_dtype) == (torch.bfloat16, torch.float32)
    mixed = [f"{fsdp}dtype=bfloat16", f"{fsdp}mixed_precision.param_dtype=fp32", f"{fsdp}mixed_precision.reduce_dtype=bf16"]
    for kwargs in _fully_shard_kwargs(spec_of(role, mixed), monkeypatch):
        assert (kwargs["mp_policy"].param_dtype, kwargs["mp_policy"].reduce_dtype) == (torch.float32, torch.bfloat16)


def _megatron_spec(role, overrides):
    section = ROLES[role][0]
    return spec_of(role, [f"{section}strategy=megatron", *[f"{section}megatron.{o}" for o in overrides]])


# What the layout does: tests/engine/test_megatron_moe.py::test_ep2_equals_ep1_after_one_optimizer_step (expert grid);
# the engine builds its Layout from the spec's megatron dict (rlcore/engine/megatron/engine.py).
@pytest.mark.parametrize("role", MEGATRON_ROLES)
def test_expert_tensor_parallel_size_sets_the_expert_layout(role):
    assert Layout.from_config(_megatron_spec(role, ["tensor_model_parallel_size=2"]).megatron).etp == 2  # null = TP
    assert Layout.from_config(_megatron_spec(role, ["tensor_model_parallel_size=2", "expert_tensor_parallel_size=1"]).megatron).etp == 1
    # The schema's defaults are the engine's: sequence parallelism on with TP (the engine's own fallback said off)
    assert Layout.from_config(_megatron_spec(role, ["tensor_model_parallel_size=2"]).megatron).sp
    assert not Layout.from_config(_megatron_spec(role, ["tensor_model_parallel_size=2", "sequence_parallel=False"]).megatron).sp


# The engine seeds megatron-core's RNG streams and torch with megatron.seed before the weights arrive
# (rlcore/engine/megatron/engine.py::MegatronEngine.__init__); it builds its modules in megatron.dtype
# (tests/engine/test_megatron_features.py builds its engines through the same spec).
@pytest.mark.parametrize("role", MEGATRON_ROLES)
def test_megatron_seed_and_dtype_reach_the_engine(role):
    spec = _megatron_spec(role, ["seed=7", "dtype=bfloat16"])
    assert spec.megatron.seed == 7 and spec.param_dtype == "bfloat16"
    other = _megatron_spec(role, ["seed=8", "dtype=float32"])
    assert other.megatron.seed == 8 and other.param_dtype == "float32"
    assert to_torch_dtype(spec.param_dtype) is torch.bfloat16


# The trained roles wrap their chunks in megatron-core's DistributedDataParallel with these fields over rlcore's own
# (rlcore/engine/megatron/engine.py::MegatronEngine._build_optimizer; the frozen reference builds no DDP).
@pytest.mark.parametrize("role", ["actor", "critic"])
def test_override_ddp_config_reaches_the_ddp_config(role):
    section = ROLES[role][0]
    spec = spec_of(role, [f"{section}strategy=megatron", f"+{section}megatron.override_ddp_config.bucket_size=1234",
                          f"+{section}megatron.override_ddp_config.average_in_collective=True"])
    assert spec.megatron.override_ddp_config == {"bucket_size": 1234, "average_in_collective": True}
    from rlcore.engine.megatron.engine import ddp_settings

    # A key rlcore sets itself is replaced, not passed twice (which raised "multiple values for keyword").
    override = dataclasses.replace(spec.megatron, override_ddp_config={"grad_reduce_in_fp32": False, "bucket_size": 1234})
    assert ddp_settings(override)["grad_reduce_in_fp32"] is False and ddp_settings(spec.megatron)["grad_reduce_in_fp32"] is True
    assert spec.trainable
