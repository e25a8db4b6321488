"""validate_config: batch plans computed by hand, every violation reported at once with a fix, all recipes."""

import copy
import functools
import importlib.util
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from rlcore.config import CONFIG_DIR, ConfigError, PPOConfig, compose, finish_composition, format_plan, validate_config
from rlcore.config.validate import BatchPlan, diagnose

ARR = "actor_rollout_ref"
RECIPES_DIR = Path(CONFIG_DIR).parent / "recipes"
RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))

# verl-like 8-GPU GRPO run: 1024 prompts x 5 samples, mini-batches of 256 prompts, 32 samples per micro-batch.
VERL_8GPU = [
    "algorithm.adv_estimator=grpo", "trainer.nnodes=1", "trainer.n_gpus_per_node=8", "data.train_batch_size=1024",
    f"{ARR}.rollout.n=5", f"{ARR}.actor.ppo_mini_batch_size=256", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=64",
]


@functools.lru_cache(maxsize=None)
def _base(recipe):
    return compose([f"recipe={recipe}"] if recipe else [])


def _cfg(overrides, recipe=None):
    """The composed base config with Hydra-parsed overrides applied on a copy: ~15x faster than composing each
    time (a compose costs ~0.2 s here). Composition itself, recipes and override parsing are tested by real
    compose calls in test_schema.py and test_every_recipe_composes_and_validates."""
    cfg = copy.deepcopy(_base(recipe))
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_add():  # `+key=value`: Hydra adds the key to the struct config
            with open_dict(cfg):
                OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
        else:
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    finish_composition(cfg, overrides)  # as compose() ends (verl 0.8's renamed keys read as their 0.9 names)
    return cfg


def _errors(overrides, recipe=None) -> list:
    with pytest.raises(ConfigError) as info:
        validate_config(_cfg(overrides, recipe))
    return info.value.messages


def test_tiny_cpu_plan_by_hand():
    # 2 ranks; 32 prompts x 8 = 256 samples; 32/32 = 1 mini-batch of 32 x 8 = 256 samples, 128 per rank,
    # 128 / 128 = 1 micro-batch; 256 / 2 = 128 samples per rank per step; 1 mini-batch x 1 epoch.
    assert validate_config(_cfg([], "tiny_cpu")) == BatchPlan(
        world_size=2, dp_size=2, prompts_per_step=32, samples_per_step=256, mini_batches_per_step=1,
        samples_per_mini_batch=256, samples_per_mini_batch_per_rank=128, micro_batches_per_mini_batch_per_rank=1,
        samples_per_rank_per_step=128, optimizer_steps_per_step=1, ppo_micro_batch_size_per_rank=128,
        log_prob_micro_batch_size_per_rank=128, ref_log_prob_micro_batch_size_per_rank=128, use_reference_policy=True,
        max_sequence_length=8 + 5,
    )


def test_verl_8gpu_plan_by_hand():
    # 1024 x 5 = 5120 samples; 1024/256 = 4 mini-batches of 1280 samples, 160 per rank, 160/32 = 5 micro-batches.
    plan = validate_config(_cfg(VERL_8GPU + [f"{ARR}.actor.ppo_epochs=2"]))
    assert plan == BatchPlan(
        world_size=8, dp_size=8, prompts_per_step=1024, samples_per_step=5120, mini_batches_per_step=4,
        samples_per_mini_batch=1280, samples_per_mini_batch_per_rank=160, micro_batches_per_mini_batch_per_rank=5,
        samples_per_rank_per_step=640, optimizer_steps_per_step=8, ppo_micro_batch_size_per_rank=32,
        log_prob_micro_batch_size_per_rank=64, ref_log_prob_micro_batch_size_per_rank=None, use_reference_policy=False,
        max_sequence_length=plan.max_sequence_length,
    )
    assert plan.max_sequence_length == 512 + 512


def test_deprecated_global_micro_batch_is_divided_by_dp():
    plan = validate_config(_cfg(VERL_8GPU + [f"{ARR}.actor.ppo_micro_batch_size_per_gpu=null",
                                                f"{ARR}.actor.ppo_micro_batch_size=256"]))
    assert plan.ppo_micro_batch_size_per_rank == 32 and plan.micro_batches_per_mini_batch_per_rank == 5


def test_dynamic_bsz_needs_no_micro_batch_size():
    plan = validate_config(_cfg(VERL_8GPU + [f"{ARR}.actor.ppo_micro_batch_size_per_gpu=null",
                                                f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=null",
                                                f"{ARR}.actor.use_dynamic_bsz=True"]))
    assert plan.micro_batches_per_mini_batch_per_rank is None and plan.log_prob_micro_batch_size_per_rank is None
    # The plan shows the budget and the most micro-batches it can take: every sample at full length.
    full = plan.ppo_max_token_len_per_rank // plan.max_sequence_length
    row = next(line for line in format_plan(plan).splitlines() if "micro_batches_per_mini_batch_per_rank" in line)
    assert f"<={-(-plan.samples_per_mini_batch_per_rank // full)} " in row and f"= {full} full-length samples" in row


def test_a_token_budget_below_one_sample_is_a_warning_and_the_plan_still_prints():
    # verl's Qwen3-30B megatron example: 16384 tokens per micro-batch for 32768-token samples (found by the corpus
    # test). verl runs it until a longer sample comes, so rlcore runs it too and says so before the run; only a
    # budget no sample fits is refused.
    from rlcore.config.validate import config_warnings, diagnose

    cfg = _cfg(VERL_8GPU + [f"{ARR}.actor.use_dynamic_bsz=True", f"{ARR}.actor.ppo_max_token_len_per_gpu=1000"])
    plan, errors = diagnose(cfg)
    assert not any("ppo_max_token_len_per_gpu" in e for e in errors)
    assert any(w.startswith(f"{ARR}.actor.ppo_max_token_len_per_gpu=1000 is smaller") for w in config_warnings(cfg))
    row = next(line for line in format_plan(plan).splitlines() if "micro_batches_per_mini_batch_per_rank" in line)
    assert " ? " in row and "= 0 full-length samples" in row
    _, errors = diagnose(_cfg(VERL_8GPU + [f"{ARR}.actor.use_dynamic_bsz=True", f"{ARR}.actor.ppo_max_token_len_per_gpu=1"]))
    assert any("ppo_max_token_len_per_gpu=1 fits no sample" in e for e in errors)


def test_validate_accepts_a_dataclass_instance():
    with pytest.raises(ConfigError, match="critic.ppo_micro_batch_size_per_gpu is required"):  # verl's default: gae
        validate_config(PPOConfig())


def test_brief_example_message_exactly():
    messages = _errors(VERL_8GPU + ["trainer.n_gpus_per_node=3", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8",
                                    f"{ARR}.rollout.tensor_model_parallel_size=1"])
    # No mini-batch size can divide 1024 prompts and give whole samples on 3 ranks: the fix names the batch first
    # (it once suggested 240 or 264, which do not divide 1024: applying it made a new error).
    assert (f"{ARR}.actor.ppo_mini_batch_size=256 x {ARR}.rollout.n=5 = 1280 samples is not divisible by 3 "
            f"data-parallel ranks; first make data.train_batch_size=1024 a multiple of 3 (then a mini-batch size "
            "dividing it will exist)") in messages
    assert any(m.startswith("data.train_batch_size=1024 x") and "use data.train_batch_size=768 or "
               "data.train_batch_size=1536" in m for m in messages)
    assert len(messages) == 2


def test_many_violations_in_one_error():
    overrides = VERL_8GPU + [
        "trainer.n_gpus_per_node=6",  # 5120 and 1280 samples not divisible by 6 ranks; TP 2 still fine
        f"{ARR}.actor.strategy=megatron", f"{ARR}.actor.megatron.expert_model_parallel_size=4", f"{ARR}.rollout.name=sglang",
        "algorithm.adv_estimator=gae", "critic.enable=False",
        f"{ARR}.model.lora_rank=8", f"{ARR}.model.lora_alpha=0", "trainer.test_freq=0", f"{ARR}.rollout.top_p=1.5", "data.truncation=lef",
        f"{ARR}.actor.use_kl_loss=True",  # reference now needed but has no micro-batch size
    ]
    with pytest.raises(ConfigError) as info:
        validate_config(_cfg(overrides))
    messages, text = info.value.messages, str(info.value)
    expected = [
        f"{ARR}.actor.megatron.expert_model_parallel_size=4 x {ARR}.actor.megatron.expert_tensor_parallel_size=null "
            "(= tensor_model_parallel_size 1) x pipeline_model_parallel_size=1 = 4 does not divide the world size 6",
        f"{ARR}.rollout.name=sglang is not supported yet by rlcore; use {ARR}.rollout.name=vllm",
        "algorithm.adv_estimator=gae needs the critic's values but critic.enable=False",
        f"{ARR}.model.lora_rank=8 is the FSDP LoRA key; with {ARR}.actor.strategy=megatron set {ARR}.model.lora.rank=8",
        f"{ARR}.model.lora_alpha=0 must be > 0",
        "trainer.test_freq=0 must be -1 (never) or > 0",
        f"{ARR}.rollout.top_p=1.5 must be in (0, 1]",
        "data.truncation=lef is not one of error, left, right, middle; use data.truncation=left",
        "data.train_batch_size=1024 x actor_rollout_ref.rollout.n=5 = 5120 samples per step is not divisible by 6",
        f"{ARR}.actor.ppo_mini_batch_size=256 x {ARR}.rollout.n=5 = 1280 samples is not divisible by 6 data-parallel "
        f"ranks; first make data.train_batch_size=1024 a multiple of 6",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu is required unless {ARR}.ref.log_prob_use_dynamic_bsz=True",
    ]
    for fragment in expected:
        assert sum(fragment in m for m in messages) == 1, fragment
    assert len(messages) == len(expected)
    assert text.startswith(f"{len(expected)} config error(s):") and all(m in text for m in messages)


def test_mini_batch_suggestions_satisfy_every_rule():
    # 6 ranks, n=5, micro 8: a valid mini-batch divides 960 and is a multiple of 48 (x 5 / 6 ranks % 8 == 0).
    messages = _errors(VERL_8GPU + ["trainer.n_gpus_per_node=6", "data.train_batch_size=960",
                                    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8"])
    assert len(messages) == 2  # 256 does not divide 960, and 256 x 5 is not divisible by 6 ranks
    for message in messages:  # both rules suggest the same values, each satisfying every rule
        suggested = [int(part.split("=")[-1]) for part in message.split("; use ")[1].split(" or ")]
        assert suggested == [240, 480], message
        for mini in suggested:
            assert 960 % mini == 0 and mini * 5 % 6 == 0 and (mini * 5 // 6) % 8 == 0


@pytest.mark.parametrize("override, fragment", [
    (f"{ARR}.actor.ppo_micro_batch_size_per_gpu=24", "= 128 samples per rank per mini-batch is not divisible by "
     f"{ARR}.actor.ppo_micro_batch_size_per_gpu=24; use {ARR}.actor.ppo_micro_batch_size_per_gpu=16 or "
     f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32"),
    (f"{ARR}.actor.ppo_micro_batch_size=64", "are both set; set only"),
    (f"{ARR}.actor.ppo_mini_batch_size=12", f"{ARR}.actor.ppo_mini_batch_size=12 does not divide "
     f"data.train_batch_size=32 (both count prompts; a step must split into whole mini-batches); "
     f"use {ARR}.actor.ppo_mini_batch_size=32"),  # the only divisor of 32 that also fits micro-batches of 128
    (f"{ARR}.actor.ppo_mini_batch_size=64", "is larger than data.train_batch_size=32"),
    (f"{ARR}.rollout.tensor_model_parallel_size=4", f"use {ARR}.rollout.tensor_model_parallel_size=2"),
    (f"{ARR}.actor.ulysses_sequence_parallel_size=4", f"{ARR}.actor.ulysses_sequence_parallel_size=4 must divide the ranks "
     "per node (trainer.n_gpus_per_node=2)"),
    ("trainer.device=npu", "trainer.device=npu is not supported by rlcore; use trainer.device=cuda"),
    ("trainer.resume_mode=resume_path", "trainer.resume_mode=resume_path needs trainer.resume_from_path"),
    ("trainer.resume_mode=latest", "trainer.resume_mode=latest is not one of auto, disable, resume_path"),
    ("algorithm.kl_penalty=k4", "algorithm.kl_penalty=k4 is not one of kl, k1, abs"),
    ("algorithm.kl_ctrl.type=linear", "algorithm.kl_ctrl.type=linear is not one of fixed, adaptive"),
    (f"{ARR}.actor.loss_agg_mode=token_mean", f"use {ARR}.actor.loss_agg_mode=token-mean"),
    (f"{ARR}.rollout.temperature=-0.5", "must be >= 0"),
    (f"{ARR}.rollout.val_kwargs.top_p=0", f"{ARR}.rollout.val_kwargs.top_p=0.0 must be in (0, 1]"),
    (f"{ARR}.actor.clip_ratio_high=0", f"{ARR}.actor.clip_ratio_high=0.0 must be > 0"),
    (f"{ARR}.actor.clip_ratio_c=0.5", "must be > 1"),
    ("trainer.save_freq=-5", "trainer.save_freq=-5 must be -1 (never) or > 0"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps=0 must be > 0"),
    ("critic.enable=True", "critic.ppo_micro_batch_size_per_gpu is required unless critic.use_dynamic_bsz=True"),
    (f"{ARR}.rollout.multi_turn.enable=True", f"multi-turn rollouts ({ARR}.rollout.multi_turn.enable=True or "
     f"{ARR}.rollout.agent.default_agent_loop=tool_agent) need tools"),
    (f"{ARR}.rollout.multi_turn.tool_config_path=tools.yaml", "tool_config_path=tools.yaml gives tools, but multi-turn "
     "rollouts are off; set actor_rollout_ref.rollout.multi_turn.enable=True"),
    (f"{ARR}.actor.fsdp_config.dtype=half", f"{ARR}.actor.fsdp_config.dtype=half is not one of"),
    (f"{ARR}.rollout.max_num_seqs=4", f"{ARR}.rollout.max_num_seqs=4 is fewer than {ARR}.rollout.n=8: the native engine "
     f"decodes a prompt's n samples together; use {ARR}.rollout.max_num_seqs=256"),
    (f"{ARR}.rollout.max_num_batched_tokens=0", f"{ARR}.rollout.max_num_batched_tokens=0 must be >= 1"),
    (f"+{ARR}.rollout.engine_kwargs.native.kv_cache_bytes=1", "engine_kwargs.native.kv_cache_bytes is not an argument of "
     "the native rollout engine; known: kv_cache_memory_bytes"),
    (f"+{ARR}.rollout.engine_kwargs.native.kv_cache_memory_bytes=-1", "kv_cache_memory_bytes=-1 must be a positive byte count"),
    (f"{ARR}.rollout.cudagraph_capture_sizes=[1,0,8]", f"{ARR}.rollout.cudagraph_capture_sizes=[1, 0, 8] must be a non-empty "
     f"list of positive batch sizes (bad: [0]); use e.g. {ARR}.rollout.cudagraph_capture_sizes=[1,2,4,8,16,32,64]"),
    (f"{ARR}.rollout.cudagraph_capture_sizes=[]", "cudagraph_capture_sizes=[] must be a non-empty list"),
])
def test_single_violation(override, fragment):
    extra = [f"{ARR}.actor.ppo_max_token_len_per_gpu=10"] if "use_dynamic_bsz" in override else []
    messages = _errors([override] + extra, recipe="tiny_cpu")
    assert any(fragment in m for m in messages), messages


def test_vllm_on_cpu_is_accepted_where_vllm_is_installed_else_says_what_to_install():
    vllm = [f"{ARR}.rollout.name=vllm"]
    if importlib.util.find_spec("vllm") is None:
        messages = _errors(vllm, recipe="tiny_cpu")
        assert len(messages) == 1 and "`make vllm-env`" in messages[0] and f"{ARR}.rollout.name=native" in messages[0], messages
    else:
        assert validate_config(_cfg(vllm, "tiny_cpu")).samples_per_step == 256
    bad_budget = f"+{ARR}.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=-1"
    assert any("engine_kwargs.vllm.kv_cache_memory_bytes=-1 must be a positive byte count" in m
               for m in _errors(vllm + [bad_budget], recipe="tiny_cpu"))


def test_capture_sizes_compose_and_validate():
    validate_config(_cfg([f"{ARR}.rollout.cudagraph_capture_sizes=[1,2,4,8]", f"{ARR}.rollout.enforce_eager=True"], "tiny_cpu"))


CRITIC = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=32", "critic.forward_micro_batch_size_per_gpu=64"]


def test_gae_turns_the_critic_on_and_plans_its_batches():
    plan = validate_config(_cfg(CRITIC, "tiny_cpu"))
    assert plan.use_critic and plan.critic_micro_batches_per_mini_batch_per_rank == 4  # 32 x 8 / 2 ranks / 32
    critic_row = format_plan(plan).splitlines()[-1].split()
    assert critic_row[2:5] == ["critic", "on", "(4"], critic_row
    assert not validate_config(_cfg([], "tiny_cpu")).use_critic  # grpo: no critic


@pytest.mark.parametrize("override, fragment", [
    ("critic.ppo_micro_batch_size_per_gpu=24", "is not divisible by critic.ppo_micro_batch_size_per_gpu=24; "
     "use critic.ppo_micro_batch_size_per_gpu=16 or critic.ppo_micro_batch_size_per_gpu=32"),
    ("critic.ppo_mini_batch_size=12", "critic.ppo_mini_batch_size=12 does not divide data.train_batch_size=32"),
    ("critic.cliprange_value=0", "critic.cliprange_value=0.0 must be > 0"),
    ("critic.loss_agg_mode=mean", "critic.loss_agg_mode=mean is not one of"),
    ("critic.ulysses_sequence_parallel_size=2 critic.model.use_remove_padding=False",  # verl 0.9 packs the critic by default
     "critic.ulysses_sequence_parallel_size=2 slices the packed sequence, which "
     "needs critic.model.use_remove_padding=True"),
    ("critic.ulysses_sequence_parallel_size=4", "critic.ulysses_sequence_parallel_size=4 does not divide the critic's 2 ranks"),
])
def test_critic_violations(override, fragment):
    messages = _errors(CRITIC + override.split(" "), recipe="tiny_cpu")
    assert any(fragment in m for m in messages), messages


def test_critic_on_its_own_pool_is_planned_on_its_own_ranks():
    own = CRITIC + ["critic.enable_resource_pool=True", "critic.n_gpus_per_node=4"]
    assert validate_config(_cfg(own, "tiny_cpu")).critic_micro_batches_per_mini_batch_per_rank == 2  # 256 / 4 / 32
    messages = _errors(own[:-1] + ["critic.n_gpus_per_node=3"], recipe="tiny_cpu")
    assert any("not divisible by the critic's 3 ranks" in m for m in messages), messages


def test_reference_sizes_only_needed_with_a_kl():
    base = [f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=null"]
    plan = validate_config(_cfg(base + [f"{ARR}.actor.use_kl_loss=False"], "tiny_cpu"))
    assert not plan.use_reference_policy and plan.ref_log_prob_micro_batch_size_per_rank is None
    messages = _errors(base + [f"{ARR}.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=True"], "tiny_cpu")
    assert [m for m in messages if f"{ARR}.ref.log_prob_micro_batch_size_per_gpu is required" in m]


def test_config_error_renders_every_message():
    error = ConfigError(["first problem", "second problem"])
    assert isinstance(error, ValueError) and error.messages == ["first problem", "second problem"]
    assert str(error) == "2 config error(s):\n  1. first problem\n  2. second problem"


def test_format_plan_is_an_aligned_table():
    lines = format_plan(validate_config(_cfg([], "tiny_cpu"))).splitlines()
    assert len(lines) == 11 and all(line.startswith("batch plan: ") for line in lines)
    assert "samples_per_step" in lines[3] and " 256 " in lines[3]
    value_ends = {line.index("  (") for line in lines}
    assert len(value_ends) == 1  # values right-aligned in one column


def test_a_megatron_critic_is_checked_on_its_own_layout():
    megatron = CRITIC + ["critic.strategy=megatron"]
    messages = _errors(megatron + ["critic.megatron.context_parallel_size=2"], recipe="tiny_cpu")
    assert any(m.startswith("critic.megatron.context_parallel_size=2 (context parallelism: "
                            "megatron-core runs it only in TransformerEngine's attention") for m in messages)
    # tiny_cpu has 2 ranks: a TP=2 critic is one data-parallel replica, so its 32-prompt mini-batch x 8 samples all
    # go to one rank in micro-batches of 32: valid, while TP=3 cannot split 2 devices.
    assert diagnose(compose(["recipe=tiny_cpu", *megatron, "critic.megatron.tensor_model_parallel_size=2"]))[1] == []
    assert any("critic.megatron.tensor_model_parallel_size=3" in m and "does not divide the world size 2" in m
               for m in _errors(megatron + ["critic.megatron.tensor_model_parallel_size=3"], recipe="tiny_cpu"))


def test_recipes_folder_has_only_yaml_recipes():
    files = sorted(p for p in RECIPES_DIR.iterdir() if not p.name.startswith("."))
    assert files == RECIPES, "every file in recipes/ must be a .yaml recipe (others would be skipped silently)"
    assert len(RECIPES) >= 1


# Recipes for features rlcore does not have yet: every other rule holds, and the refusal is exactly this.
NOT_YET: dict[str, list[str]] = {}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_composes_and_validates(recipe):
    cfg = compose([f"recipe={recipe.stem}"])
    plan, errors = diagnose(cfg)
    expected = NOT_YET.get(recipe.stem, [])
    assert len(errors) == len(expected) and all(e.startswith(x) for e, x in zip(errors, expected)), errors
    assert plan.samples_per_step == cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    if not expected:
        assert validate_config(cfg) == plan


def test_what_verl_runs_is_accepted_with_a_warning_and_what_it_cannot_run_is_refused():
    """As strict as verl 0.9, not stricter: a token budget below the longest possible sample runs until a sample
    longer than it comes (verl's assert, and rlcore's, stop the pass then); a group estimator with rollout.n=1 gives
    each sample its own score as advantage (verl's group of one); grpo_passk needs two samples (verl raises)."""
    from rlcore.config.validate import config_warnings

    short = _cfg(CRITIC + [f"{ARR}.actor.use_dynamic_bsz=True", f"{ARR}.actor.ppo_max_token_len_per_gpu=10", "critic.use_dynamic_bsz=True",
                           "critic.forward_max_token_len_per_gpu=12", f"{ARR}.rollout.n=1"], recipe="tiny_cpu")
    assert diagnose(short)[1] == []
    # the actor's budget, the old-log-prob pass's that follows it, the critic's forward (gae has no groups: n=1 is fine)
    said = config_warnings(short)
    assert [w.split("=", 1)[0] for w in said] == [f"{ARR}.actor.ppo_max_token_len_per_gpu", f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
                                                  f"{ARR}.ref.log_prob_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"]
    assert said[0].startswith(f"{ARR}.actor.ppo_max_token_len_per_gpu=10 is smaller than data.max_prompt_length "
                              "+ data.max_response_length = 13 tokens: a sample longer than 10 tokens stops the run")
    grpo = _cfg([f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16"], recipe="tiny_cpu")
    assert diagnose(grpo)[1] == [] and config_warnings(grpo)[0].startswith(
        f"algorithm.adv_estimator=grpo with {ARR}.rollout.n=1: each sample is its own group")
    assert _errors(["algorithm.adv_estimator=grpo_passk", f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16"],
                   recipe="tiny_cpu") == [
        f"algorithm.adv_estimator=grpo_passk compares each prompt's best sample with its second best, so {ARR}.rollout.n=1 "
        f"cannot run (verl stops at the first step too); use {ARR}.rollout.n=4 or more"]
    tiny = _errors([f"{ARR}.actor.use_dynamic_bsz=True", f"{ARR}.actor.ppo_max_token_len_per_gpu=1"], recipe="tiny_cpu")
    assert tiny[0] == (f"{ARR}.actor.ppo_max_token_len_per_gpu=1 fits no sample (a prompt token and a response token at least); "
                       f"use {ARR}.actor.ppo_max_token_len_per_gpu=13")  # then the passes whose budgets follow it


DAPO = ["reward.reward_manager.name=dapo", "+reward.reward_kwargs.max_resp_len=5",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True", "+reward.reward_kwargs.overlong_buffer_cfg.len=2",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0", "+reward.reward_kwargs.overlong_buffer_cfg.log=False"]


def test_verl_dapo_reward_keys_are_accepted():
    cfg = _cfg(DAPO, "tiny_cpu")  # verl's DAPO scripts add these with `+`
    assert validate_config(cfg).samples_per_step == 256  # no error, and the plan is unchanged
    assert OmegaConf.to_container(cfg.reward.reward_kwargs) == {
        "max_resp_len": 5, "overlong_buffer_cfg": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": False}}


@pytest.mark.parametrize("override, fragment", [
    ("reward.reward_manager.name=prime", "reward.reward_manager.name=prime is not supported yet by rlcore; use "
     "reward.reward_manager.name=naive"),
    ("reward.reward_manager.name=dapos", "is not one of naive, dapo, gdpo; use reward.reward_manager.name=dapo"),
    ("+reward.reward_kwargs.max_resp_length=5", "reward.reward_kwargs.max_resp_length is not an argument of "
     "reward.reward_manager.name=dapo; it takes: max_resp_len, overlong_buffer_cfg"),
    ("+reward.reward_kwargs.overlong_buffer_cfg.size=3", "overlong_buffer_cfg.size is unknown"),
    ("reward.reward_kwargs.overlong_buffer_cfg.len=9", "the overlong buffer needs 0 < overlong_buffer_cfg.len (9) <= max_resp_len (5)"),
])
def test_reward_manager_violations(override, fragment):
    messages = _errors(DAPO + [override], recipe="tiny_cpu")
    assert any(fragment in m for m in messages), messages


RM = ["reward.reward_model.enable=True", "reward.reward_model.model_path=/rm", "reward_model.micro_batch_size_per_gpu=8"]


def test_reward_model_keys_of_verl_compose_and_what_is_not_implemented_is_refused():
    assert validate_config(_cfg(RM, "tiny_cpu")).samples_per_step == 256
    # verl's newer reward-loop keys compose (so verl command lines parse) and stay inert while off
    assert validate_config(_cfg(RM + ["reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=2",
                                      "reward.num_workers=2", "trainer.use_legacy_worker_impl=enable"], "tiny_cpu"))
    messages = _errors(["reward.reward_model.enable=True", "reward.reward_model.model_path=/rm", "reward_model.use_reward_loop=False",
                        "reward_model.strategy=megatron",
                        "trainer.use_legacy_worker_impl=disable", "reward.reward_model.enable_resource_pool=True"], "tiny_cpu")
    expected = ["reward_model.strategy=megatron is not supported for the reward model",
                "trainer.use_legacy_worker_impl=disable selects verl's new worker implementation",
                "reward_model.micro_batch_size_per_gpu is required unless reward_model.use_dynamic_bsz=True or reward_model.use_reward_loop=True",
                "reward.reward_model.nnodes=0 must be >= 1"]
    assert len(messages) == len(expected) and all(m.startswith(e) for m, e in zip(messages, expected)), messages
    # verl's reward loop (its default) fills the forwards by tokens when no micro-batch size is given, as its engine does
    assert validate_config(_cfg(["reward.reward_model.enable=True", "reward.reward_model.model_path=/rm", "reward_model.rollout.name=vllm"],
                                "tiny_cpu"))
    budget = _errors(["reward.reward_model.enable=True", "reward.reward_model.model_path=/rm", "reward_model.forward_max_token_len_per_gpu=10"],
                     "tiny_cpu")
    # without a model to score with: named (verl 0.8's key too)
    assert _errors(["reward.reward_model.enable=True"], "tiny_cpu") == [
        "reward.reward_model.enable=True needs reward.reward_model.model_path: a local HF *ForSequenceClassification "
        "(num_labels=1) directory (verl 0.8: reward_model.model.path)"]
    assert budget == ["reward_model.forward_max_token_len_per_gpu=10 is smaller than the longest scored sequence (13 tokens: "
                      "reward_model.max_length or data.max_prompt_length + data.max_response_length); use "
                      "reward_model.forward_max_token_len_per_gpu=13"]


def test_tp_groups_never_straddle_two_nodes():
    """Ranks are placed node by node; a TP group (contiguous ranks) must divide the ranks per node even where it
    divides the world: 2 nodes x 6 ranks with TP 4 would put ranks 4-7 across both nodes. A rollout TP group of
    whole nodes is one replica spanning them."""
    nodes = ["trainer.nnodes=2", "trainer.n_gpus_per_node=6", "data.train_batch_size=48", f"{ARR}.actor.ppo_mini_batch_size=48",
             f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32"]
    messages = _errors(nodes + [f"{ARR}.rollout.tensor_model_parallel_size=4"], recipe="tiny_cpu")
    assert any(m.startswith(f"{ARR}.rollout.tensor_model_parallel_size=4 must divide trainer.n_gpus_per_node=6") and
               "straddle two nodes" in m and f"use {ARR}.rollout.tensor_model_parallel_size=3" in m for m in messages), messages
    megatron = [f"{ARR}.actor.strategy=megatron", f"{ARR}.ref.strategy=megatron", f"{ARR}.actor.megatron.tensor_model_parallel_size=4",
                f"{ARR}.ref.megatron.tensor_model_parallel_size=4"]
    messages = _errors(nodes + megatron, recipe="tiny_cpu")
    assert any(m.startswith(f"{ARR}.actor.megatron.tensor_model_parallel_size=4 must divide the ranks per node (6)") for m in messages), messages
    validate_config(_cfg(nodes + [f"{ARR}.rollout.tensor_model_parallel_size=2"], recipe="tiny_cpu"))  # 3 replicas per node
    # whole nodes (verl's 72B scripts: TP16 on nodes of 8) are one replica spanning them
    validate_config(_cfg(nodes + [f"{ARR}.rollout.tensor_model_parallel_size=6"], recipe="tiny_cpu"))
    validate_config(_cfg(nodes + [f"{ARR}.rollout.tensor_model_parallel_size=12"], recipe="tiny_cpu"))
    messages = _errors(["trainer.nnodes=3"] + nodes[1:] + [f"{ARR}.rollout.tensor_model_parallel_size=12"], recipe="tiny_cpu")
    assert any(m.startswith(f"{ARR}.rollout.tensor_model_parallel_size=12 must divide trainer.n_gpus_per_node=6, or be "
                            "whole nodes of it dividing the 18 devices") for m in messages), messages


@pytest.mark.parametrize("overrides, message", [
    ([f"{ARR}.rollout.expert_parallel_size=2"], "the native engine holds every expert on each rank"),
    ([f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.expert_parallel_size=4", "trainer.device=cuda"],
     f"{ARR}.rollout.expert_parallel_size=4 must be 1 or tensor_model_parallel_size x data_parallel_size = 2 x 1"),
    ([f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.expert_parallel_size=2", "trainer.device=cpu"], "vLLM's CPU MoE kernel crashes"),
    ([f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.expert_parallel_size=4", f"{ARR}.rollout.data_parallel_size=2", "trainer.device=cuda"],
     f"{ARR}.rollout.expert_parallel_size=4 with {ARR}.rollout.data_parallel_size=2: experts spread over vLLM's data-parallel ranks"),
])
def test_rollout_expert_parallel_size_follows_verls_rule(overrides, message):
    assert any(message in m for m in _errors(VERL_8GPU + overrides)), _errors(VERL_8GPU + overrides)
    assert not [m for m in _errors(VERL_8GPU + [f"{ARR}.rollout.name=vllm", "trainer.device=cuda", f"{ARR}.rollout.expert_parallel_size=2",
                                                f"{ARR}.rollout.top_p=2"]) if "expert_parallel_size" in m]


def test_verls_fsdp_version_keys_compose_and_a_version_that_is_not_fsdp_is_refused():
    """verl's engine config names its FSDP version (fsdp_config.strategy) and FSDP1's use_orig_params; rlcore trains
    with FSDP2 either way and reports them as having no effect."""
    from rlcore.config.key_status import ineffective_settings

    cfg = _cfg([f"{ARR}.actor.fsdp_config.strategy=fsdp2", f"{ARR}.actor.fsdp_config.use_orig_params=True"], "tiny_cpu")
    assert validate_config(cfg)
    reported = [line.split("=", 1)[0] for line in ineffective_settings(cfg)]
    assert f"{ARR}.actor.fsdp_config.strategy" in reported and f"{ARR}.actor.fsdp_config.use_orig_params" in reported
    assert _errors([f"{ARR}.actor.fsdp_config.strategy=ddp"], "tiny_cpu") == [
        f"{ARR}.actor.fsdp_config.strategy=ddp is not an FSDP version; use fsdp or fsdp2 (rlcore trains with FSDP2 either way)"]
