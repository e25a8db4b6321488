"""The typed schema and its Hydra composition: verl key names and defaults, recipes, strictness."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from rlcore.config import CONFIG_DIR, PPOConfig, compose, register_configs
from rlcore.config.actor_schema import ActorConfig

REPO_ROOT = Path(CONFIG_DIR).parent
# CI clones the repo with shared/ beside it (../shared), as on developer machines: verl 0.9's tree and 0.8's
VERL_KEYS = REPO_ROOT.parent / "shared" / "reference" / "verl_0.9_config_keys.txt"
VERL_08_KEYS = REPO_ROOT.parent / "shared" / "reference" / "verl_config_keys.txt"
# Defaults rlcore deliberately changes from verl 0.9's, with the reason.
RLCORE_DEFAULTS = {"actor_rollout_ref.rollout.name": "native",  # verl: ??? (mandatory); native is embedded
                   # verl: ??? (mandatory); no effect here, and a run's typed config has no unset mandatory keys
                   "reward.reward_model.rollout.name": None,
                   # verl: 0.2 each, so that its clip_ratio alone changed nothing; rlcore's follow clip_ratio
                   "actor_rollout_ref.actor.clip_ratio_low": "${.clip_ratio}", "actor_rollout_ref.actor.clip_ratio_high": "${.clip_ratio}",
                   # verl: disabled, and never read (its reference does not replay); rlcore's follows the actor's
                   "actor_rollout_ref.ref.router_replay.mode": "${oc.select:actor_rollout_ref.actor.router_replay.mode,disabled}",
                   # verl: null here, {} in its Megatron optim tree, whose scripts add keys with `+` (a null refuses them)
                   "actor_rollout_ref.actor.optim.override_optimizer_config": {}, "critic.optim.override_optimizer_config": {},
                   # verl: true (and its constant schedule runs the first update at lr 0 whatever the key says); rlcore
                   # counts the first update as the schedule's step 1, as before the key existed (True: verl's count)
                   "actor_rollout_ref.actor.optim.zero_indexed_step": False, "critic.optim.zero_indexed_step": False,
                   # verl: 42; rlcore's follows trainer.seed, so that a sweep over trainer.seed varies the samples too
                   "actor_rollout_ref.rollout.seed": "${trainer.seed}",
                   # verl: null, meaning train_batch_size; rlcore's says so
                   "data.gen_batch_size": "${data.train_batch_size}",
                   # verl 0.9: null (its reward loop has no such key); rlcore's reward-model worker imports the policy's
                   "reward_model.model.external_lib": "${actor_rollout_ref.model.external_lib}",
                   "reward_model.model.trust_remote_code": False,  # verl 0.9: null (a legacy key); the worker's own switch
                   # verl: a teacher pool of its own always (8 per node); rlcore's teachers share the actor's devices unless
                   # given a pool, with one device per replica, in the rollout's engine, dtype and temperature (None)
                   "distillation.n_gpus_per_node": 0,
                   "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size": 1,
                   "distillation.teacher_models.teacher_model.inference.name": None,
                   "distillation.teacher_models.teacher_model.inference.dtype": None,
                   "distillation.teacher_models.teacher_model.inference.temperature": None}
# Defaults of verl 0.8 keys that verl 0.9 dropped and rlcore keeps (its reward-model worker's), where they differ
RLCORE_08_DEFAULTS = {}
RLCORE_ADDITIONS = {
    "reward_model.model.fsdp_config.dtype", "reward_model.model.fsdp_config.offload_policy",
    "actor_rollout_ref.rollout.engine_kwargs.native",
    "trainer.seed", "trainer.max_worker_restarts", "trainer.verbosity", "ray_kwargs.ray_init.address",
    "critic.enable_resource_pool", "critic.nnodes", "critic.n_gpus_per_node", "custom_algorithms.path",
    "reward.reward_kwargs",  # not in verl's tree: its DAPO scripts add it with `+`, which needs the dict here
    "trainer.device_memory_gb", "data.skip_bad_rows", "reward_model.score_workers", "reward_model.score_timeout_s",
    "reward_model.error_score", "reward_model.max_error_rate", "trainer.hang_timeout_s", "trainer.placement_timeout_s",
    "actor_rollout_ref.rollout.multi_turn.tool_timeout_s",
    # verl's DAPO recipe tree (recipe/dapo/config), not its main trainer tree; defaults as there
    "reward_model.overlong_buffer.enable", "reward_model.overlong_buffer.len",
    "reward_model.overlong_buffer.penalty_factor", "reward_model.overlong_buffer.log",
    # verl's AlgoConfig dataclass has them but its YAML tree does not: its GDPO script adds them with `+`
    "algorithm.gdpo_reward_keys", "algorithm.gdpo_reward_weights",
    # verl 0.9's SAPO scripts add them with `+` (verl reads the actor's tau_pos / tau_neg)
    "actor_rollout_ref.actor.policy_loss.tau_pos", "actor_rollout_ref.actor.policy_loss.tau_neg",
    # verl's Megatron optim tree (optim/megatron.yaml) names the schedule so; its FSDP tree, listed here, does not
    *(f"{role}.optim.{key}" for role in ("actor_rollout_ref.actor", "critic")
      for key in ("lr_decay_style", "min_lr", "lr_warmup_init", "lr_decay_steps")),
    # verl's fsdp_config.mixed_precision is a null dict its scripts fill with `+`; rlcore types its three keys
    *(f"{role}.mixed_precision.{key}" for role in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
      for key in ("param_dtype", "reduce_dtype", "buffer_dtype")),
    "critic.checkpoint.strict",  # as the actor's checkpoint section (verl 0.9's critic section lacks it)
    "model_engine",  # verl 0.9's defaults-list group (config/model_engine/), not a key of its flattened tree
    "ray_kwargs.ray_init.runtime_env.env_vars",  # Ray's runtime_env field; verl's tree lists only py_executable
    # verl 0.9's reward model runs in its reward loop, without a profiler section; rlcore's worker has one
    "reward_model.profiler.finish_hook_cmd", "reward_model.profiler.finish_hook_ranks",
    "reward_model.profiler.finish_hook_all_ranks", "reward_model.profiler.relocate_results",
}
# verl's `<role>.megatron.*` sections (and the policy's Megatron LoRA section) live in its ppo_megatron_trainer tree,
# not in the FSDP reference above.
MEGATRON_SECTIONS = ("actor_rollout_ref.actor.megatron.", "actor_rollout_ref.ref.megatron.", "critic.megatron.",
                     "actor_rollout_ref.model.lora.")
# verl's fully-async recipe keys (its own trainer config, not the main tree the reference lists)
ASYNC_SECTIONS = ("async_training.", "rollout.")
# verl's rollout and reward-model profiler tool_config is one node that follows the actor's; rlcore's are sections of
# their own, key for key the actor's
WHOLE_NODES = ("actor_rollout_ref.rollout.profiler.tool_config.", "reward_model.profiler.tool_config.")
# verl's on-policy distillation section is newer than the reference key tree (its docs/algo/opd.md keys, checked in
# tests/config/test_distill_schema.py)
DISTILLATION_SECTIONS = ("distillation.",)


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_schema_imports_without_torch_or_ray():
    code = ("import sys, rlcore.config, rlcore.config.schema, rlcore.config.validate; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO_ROOT)


def test_config_dir_layout():
    assert Path(CONFIG_DIR).is_dir() and (Path(CONFIG_DIR) / "ppo_trainer.yaml").is_file()
    recipe_link = Path(CONFIG_DIR) / "recipe"
    assert recipe_link.is_symlink() and os.readlink(recipe_link) == "../recipes"  # relative: survives a move
    assert recipe_link.resolve() == (REPO_ROOT / "recipes").resolve()


def test_register_configs_is_idempotent():
    register_configs()
    register_configs()
    assert compose([]).trainer.nnodes == 1


def test_default_composes_typed_with_verl_defaults():
    cfg = compose([])
    assert OmegaConf.get_type(cfg) is PPOConfig
    assert OmegaConf.get_type(cfg.actor_rollout_ref.actor) is ActorConfig
    assert OmegaConf.is_struct(cfg)
    assert cfg.data.train_batch_size == 1024 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.rollout.name == "native" and cfg.algorithm.adv_estimator == "gae"
    assert cfg.trainer.default_local_dir == "checkpoints/verl_examples/gsm8k"
    assert cfg.ray_kwargs.ray_init.address is None and cfg.actor_rollout_ref.nccl_timeout == 600


def test_interpolated_defaults_follow_their_source():
    cfg = compose(["data.max_prompt_length=100", "data.max_response_length=50",
                   "actor_rollout_ref.actor.use_dynamic_bsz=True",
                   "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=999",
                   "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                   "actor_rollout_ref.actor.checkpoint.save_contents=[model]", "critic.shuffle=True"])
    arr = cfg.actor_rollout_ref
    assert (arr.rollout.prompt_length, arr.rollout.response_length) == (100, 50)
    assert arr.ref.log_prob_use_dynamic_bsz and arr.rollout.log_prob_use_dynamic_bsz
    assert arr.ref.log_prob_max_token_len_per_gpu == 999 == arr.rollout.log_prob_max_token_len_per_gpu
    assert cfg.critic.ppo_mini_batch_size == 64 and cfg.critic.use_dynamic_bsz
    assert list(arr.actor.checkpoint.load_contents) == ["model"]
    assert cfg.critic.shuffle and not arr.actor.shuffle  # an explicit value wins over the interpolation


def _verl_tree(path: Path) -> dict:
    def parse(text: str):
        try:
            return json.loads(text)
        except ValueError:
            return text

    tree = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            tree[key] = parse(value)
    return tree


@pytest.mark.skipif(not VERL_KEYS.is_file(), reason=f"verl key reference not present at {VERL_KEYS}")
def test_defaults_match_verl_reference():
    """Every schema key that verl 0.9 has carries 0.9's default (interpolations verbatim), except RLCORE_DEFAULTS; a key
    only verl 0.8 has carries 0.8's, unless it is 0.8's name of a renamed key (rlcore/config/renamed.py: unset, None);
    every other key is an rlcore addition."""
    from rlcore.config.renamed import renamed_from

    verl, verl08 = _verl_tree(VERL_KEYS), _verl_tree(VERL_08_KEYS)
    ours = _flatten(OmegaConf.to_container(OmegaConf.structured(PPOConfig), resolve=False))
    others = MEGATRON_SECTIONS + ASYNC_SECTIONS + WHOLE_NODES + DISTILLATION_SECTIONS
    assert {key for key in set(ours) - set(verl) - set(verl08) if not key.startswith(others) and not renamed_from(key)} == RLCORE_ADDITIONS
    differ = {key: (ours[key], verl[key]) for key in ours
              if key in verl and ours[key] != verl[key] and not key.startswith(WHOLE_NODES) and not renamed_from(key)}
    assert differ == {key: (value, verl[key]) for key, value in RLCORE_DEFAULTS.items()}
    # 0.8's names of renamed keys: unset (None, {}), or a section's leaves as the 0.9 section's ("set" = differs)
    renamed = {key for key in ours if renamed_from(key)}
    assert not [key for key in renamed if ours[key] not in (None, {}, ours.get(renamed_from(key)))]
    only_08 = {key for key in ours if key in verl08 and key not in verl and not key.startswith(others)} - renamed
    assert {key: (ours[key], verl08[key]) for key in only_08 if ours[key] != verl08[key]} == RLCORE_08_DEFAULTS


def test_tiny_cpu_recipe_overrides_everything():
    cfg = compose(["recipe=tiny_cpu"])
    assert cfg.trainer.device == "cpu" and cfg.trainer.n_gpus_per_node == 2
    assert list(cfg.trainer.logger) == ["console", "jsonl"]
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.actor.fsdp_config.dtype == "float32"
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-4
    # interpolations resolved; one checkpoint directory per run (a timestamp), so a new demo never resumes an old one
    assert re.fullmatch(r"outputs/checkpoints/rlcore/tiny_cpu_grpo/\d{8}-\d{6}", cfg.trainer.default_local_dir)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0
    assert not cfg.actor_rollout_ref.rollout.val_kwargs.do_sample
    # the command line still wins over the recipe
    assert compose(["recipe=tiny_cpu", "actor_rollout_ref.rollout.n=4"]).actor_rollout_ref.rollout.n == 4


def test_misspelled_key_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="ppo_mini_batchsize"):
        compose(["actor_rollout_ref.actor.ppo_mini_batchsize=4"])


def test_wrong_type_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="train_batch_size"):
        compose(["data.train_batch_size=many"])


def test_unknown_key_access_fails():
    cfg = compose([])
    with pytest.raises(AttributeError):
        _ = cfg.actor_rollout_ref.actor.ppo_mini_batchsize


def test_plus_adds_new_keys_as_in_hydra():
    cfg = compose(["+new_key=1", "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                   "+reward.reward_kwargs.max_resp_len=8"])
    assert cfg.new_key == 1
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.0
    assert cfg.reward.reward_kwargs.max_resp_len == 8


def test_verl_command_line_composes():
    """A verl GRPO example command line (Qwen2-7B, gsm8k, 8 GPUs) composes unchanged."""
    cfg = compose([
        "algorithm.adv_estimator=grpo", "data.train_files=[a.parquet,b.parquet]", "data.val_files=test.parquet",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation=error",
        "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0", "trainer.logger=['console','wandb']", "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
        "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
    ])
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.6
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz  # follows the actor, as in verl
    assert list(cfg.data.train_files) == ["a.parquet", "b.parquet"]
    from rlcore.config import validate_config

    plan = validate_config(cfg)
    assert plan.samples_per_step == 5120 and plan.micro_batches_per_mini_batch_per_rank is None


def test_verl_top_100_example_keys_all_compose():
    """The keys verl's example scripts use most (../shared/reference): each is a schema key, or sits under a
    free-form dict that verl's scripts also extend with `+` (reward.reward_kwargs); the megatron ones in the
    ppo_megatron_trainer tree, as in verl."""
    counts = REPO_ROOT.parent / "shared" / "reference" / "verl_example_key_counts.txt"
    keys = [line.split("\t")[1].strip() for line in counts.read_text().splitlines() if "\t" in line]
    fsdp, megatron = compose([]), compose([], config_name="ppo_megatron_trainer")

    def accepted(cfg, key: str) -> bool:
        parts = key.split(".")
        for depth in range(len(parts), 0, -1):
            node = OmegaConf.select(cfg, ".".join(parts[:depth]), default="<absent>")
            if not (isinstance(node, str) and node == "<absent>"):
                # the key itself, or its nearest existing ancestor is a plain dict (not a typed section)
                return depth == len(parts) or OmegaConf.get_type(node) is dict
        return False

    top = keys[:100]
    assert [k for k in top if not accepted(megatron if ".megatron." in k else fsdp, k)] == []
    assert megatron.actor_rollout_ref.actor.strategy == "megatron" == megatron.actor_rollout_ref.ref.strategy
    # beyond the top 100: every megatron key verl's examples use composes in the megatron tree
    assert [k for k in keys if ".megatron." in k and not accepted(megatron, k)] == []


def test_megatron_command_line_composes_and_validates():
    cfg = compose(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                   "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                   "actor_rollout_ref.actor.megatron.param_offload=True",
                   "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                   "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo",
                   "actor_rollout_ref.rollout.n=4"],
                  config_name="ppo_megatron_trainer")
    assert cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 4  # the reference follows the actor
    assert cfg.actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype == "fp32"
    from rlcore.config.validate import diagnose

    plan, errors = diagnose(cfg)
    assert errors == []
    assert plan.dp_size == 1  # 8 devices = TP4 x PP2 x DP1
    for key, value, what in (("context_parallel_size", 2, "context parallelism"),
                             ("use_dist_checkpointing", True, "initial weights from a Megatron dist checkpoint")):
        _, errors = diagnose(compose([f"actor_rollout_ref.actor.megatron.{key}={value}"],
                                     config_name="ppo_megatron_trainer"))
        assert any(e.startswith(f"actor_rollout_ref.actor.megatron.{key}={value} ({what}") and "is not supported by rlcore" in e
                   for e in errors), errors
    _, errors = diagnose(compose(["+actor_rollout_ref.actor.megatron.override_mcore_model_config.rotary_base=1e6"],
                                 config_name="ppo_megatron_trainer"))
    assert any(e.startswith("actor_rollout_ref.actor.megatron.override_mcore_model_config is not supported") for e in errors), errors
    _, errors = diagnose(compose(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"],
                                 config_name="ppo_megatron_trainer"))
    assert any("= 3 devices per model replica does not divide the world size 8" in e and
               "tensor_model_parallel_size=2 or actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4" in e
               for e in errors)
