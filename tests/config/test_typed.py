"""The run's config as the schema's objects (rlcore.config.typed): what the controller and the workers read."""

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from rlcore.config import compose
from rlcore.config.distill_schema import TeacherModelConfig, teacher_entries
from rlcore.config.megatron_schema import MegatronConfig
from rlcore.config.rm_schema import RMTrainerConfig
from rlcore.config.schema import PPOConfig
from rlcore.config.typed import as_dictconfig, dotted, plain, typed
from rlcore.train_rm import compose_rm

# one of each kind: FSDP2 with a critic, Megatron MoE, a vision-language model, distillation, split pools, tools
RECIPES = ["tiny_cpu_ppo", "qwen3_30b_a3b_grpo_megatron", "qwen2_5_vl_7b_grpo", "qwen3_8b_opd_qwen3_32b", "qwen2_7b_grpo_async",
           "qwen2_5_3b_gsm8k_tools"]


def test_each_kind_of_recipe_becomes_the_schemas_objects_with_its_values():
    for recipe in RECIPES:
        cfg = compose([f"recipe={recipe}"])
        run = typed(cfg, PPOConfig)  # a mandatory key left unset, or a value of the wrong type, would raise here
        assert isinstance(run, PPOConfig) and isinstance(run.actor_rollout_ref.actor.megatron, MegatronConfig), recipe
        # interpolations resolved, dict-valued keys plain dicts
        assert run.actor_rollout_ref.actor.clip_ratio_low == cfg.actor_rollout_ref.actor.clip_ratio_low, recipe
        assert type(run.actor_rollout_ref.model.override_config) is dict and type(run.reward_model.reward_kwargs) is dict


def test_a_dict_lands_over_the_schema_defaults_and_a_key_the_schema_lacks_raises():
    cfg = OmegaConf.to_container(compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.ppo_epochs=3"]), resolve=True)
    del cfg["critic"]  # a section the dict lacks is the schema's
    run = typed(cfg, PPOConfig)
    assert run.actor_rollout_ref.actor.ppo_epochs == 3 and run.critic.optim.lr == PPOConfig().critic.optim.lr
    assert run.critic.ppo_epochs == 3  # the schema's interpolation (it follows the actor's)
    assert typed(run, PPOConfig) is run
    cfg["actor_rollout_ref"]["actor"]["ppo_epoch"] = 2  # misspelt
    with pytest.raises(ConfigKeyError, match="ppo_epoch"):
        typed(cfg, PPOConfig)
    assert isinstance(typed(compose_rm([]), RMTrainerConfig), RMTrainerConfig)


def test_dotted_reads_either_form_and_answers_none_where_a_section_lacks_the_key():
    cfg = compose(["recipe=tiny_cpu"])
    run = typed(cfg, PPOConfig)
    for config in (cfg, run):
        get = dotted(config)
        assert get("actor_rollout_ref.rollout.n") == cfg.actor_rollout_ref.rollout.n
        assert get("actor_rollout_ref.rollout.no_such_key") is None and get("no.such.section") is None
    assert plain(run.actor_rollout_ref.actor.policy_loss) == plain(cfg.actor_rollout_ref.actor.policy_loss)
    # what a user's agent loop gets: verl's DictConfig, .get and all
    assert as_dictconfig(run).actor_rollout_ref.rollout.get("n") == cfg.actor_rollout_ref.rollout.n


def test_teacher_entries_are_typed_from_either_form():
    overrides = ["recipe=tiny_cpu", "distillation.enabled=True", "+distillation.teacher_models.t.model_path=/m",
                 "actor_rollout_ref.rollout.temperature=0.7"]
    cfg = compose(overrides)
    for config in (cfg, typed(cfg, PPOConfig)):
        (teacher,) = teacher_entries(config).values()
        assert isinstance(teacher, TeacherModelConfig) and teacher.inference.temperature == 0.7  # the rollout's, unset here
