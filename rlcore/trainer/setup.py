"""Builds the controller-side pieces from config: tokenizer, prompt loaders, reward functions, step count."""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import partial

import pyarrow as pa
from omegaconf import DictConfig

from rlcore.config.agent_loop_config import BUILTIN_AGENT_LOOPS, agent_name_problem, load_agent_loop_config
from rlcore.config.distill_schema import teacher_entries
from rlcore.config.files import file_list
from rlcore.config.interaction_config import interaction_name_problem, load_interaction_config
from rlcore.config.tool_config import tool_schemas, tools_enabled
from rlcore.config.typed import plain
from rlcore.config.validate import ConfigError
from rlcore.data.dataset import RLHFDataset
from rlcore.data.loader import PromptLoader
from rlcore.data.row_checks import rule_score_problem
from rlcore.data.sampler import build_sampler
from rlcore.models.hf import ModelLoadError, import_external_lib, load_tokenizer, policy_tokenizer
from rlcore.models.vision import vision_processor
from rlcore.reward.custom import load_custom_reward_fn
from rlcore.reward.isolation import IsolatedScorer
from rlcore.reward.manager import RewardManager, ScoreGuard, build_reward_manager
from rlcore.reward.scorers import default_compute_score, registered_data_sources
from rlcore.trainer.distillation import tokenizer_mismatch


@contextmanager
def loading(key: str, value, what: str, catch: tuple = (OSError, ValueError, ImportError, KeyError)):
    """A file the config points at that exists but does not load (a broken tokenizer, a parquet file that is not
    one, a reward file that raises on import) becomes one line naming the key, not a traceback from inside the
    library. `catch`: the errors that mean "does not load" (the dataset's own row report is already a message)."""
    try:
        yield
    except ConfigError:
        raise
    except catch as err:
        reason = " ".join(str(err).split())
        raise ConfigError([f"{key}={value}: {what} does not load: {type(err).__name__}: {reason}"]) from err


def build_data(cfg: DictConfig):
    model, data = cfg.actor_rollout_ref.model, cfg.data
    # Before the tokenizer: the module may register the tokenizer's or the model's classes (workers import it too).
    try:
        import_external_lib(model.external_lib, "actor_rollout_ref.model.external_lib")
    except ModelLoadError as err:
        raise ConfigError([str(err)]) from err
    key = "actor_rollout_ref.model.tokenizer_path" if model.tokenizer_path else "actor_rollout_ref.model.path"
    with loading(key, model.tokenizer_path or model.path, "the tokenizer"):
        # The prompts render in the policy's custom_chat_template, as the workers' multi-turn turns do (verl: data's
        # trust_remote_code for the controller's tokenizer).
        tokenizer = policy_tokenizer(model, data.trust_remote_code)
    with loading("actor_rollout_ref.model.path", model.path, "the vision-language processor"):
        processor = vision_processor(model.path, data.trust_remote_code)  # None: a text-only model
    # Rule scorers need a scorer per data source and a ground truth: checked on every row at load. A custom
    # compute_score decides for itself; a reward model scores training rows (validation stays rule-scored).
    rule = [] if cfg.reward.custom_reward_function.path else [partial(rule_score_problem, source_key=data.reward_fn_key,
                                                                scored_sources=registered_data_sources())]

    check_teacher_tokenizers(cfg, tokenizer)
    interactions = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if interactions and tools_enabled(cfg):  # every row names an interaction the config has (verl fails mid-run)
        names = {spec.name for spec in load_interaction_config(os.path.expanduser(str(interactions)))}
        agents = [partial(interaction_name_problem, names=names)]
    else:
        agents = []
    loops = cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path
    if loops:  # every row's agent_name is a loop there is (verl asserts it mid-run)
        names = {*BUILTIN_AGENT_LOOPS, *(spec.name for spec in load_agent_loop_config(os.path.expanduser(str(loops))))}
        agents.append(partial(agent_name_problem, names=names))
    tools = tool_schemas(cfg)  # rendered into the prompt by the chat template, as verl's dataset does

    def dataset(files, max_samples, checks, key):
        with loading(key, files, "the data", catch=(OSError, KeyError, pa.ArrowException)):
            return RLHFDataset(
                file_list(files), tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                max_samples=max_samples, return_raw_chat=data.return_raw_chat, row_checks=checks, skip_bad_rows=data.skip_bad_rows,
                tools=tools, return_full_prompt=data.return_full_prompt,
                chat_template_kwargs=plain(data.apply_chat_template_kwargs),
                processor=processor, image_key=data.image_key, video_key=data.video_key,
            )

    seed = data.seed if data.seed is not None else cfg.trainer.seed
    # Prompts are drawn a generation batch at a time (= train_batch_size unless DAPO's dynamic sampling is on).
    train_set = dataset(data.train_files, data.train_max_samples, [*agents, *([] if cfg.reward.reward_model.enable else rule)], "data.train_files")
    with loading("data.sampler.class_path", data.sampler.class_path, "the data sampler", catch=(OSError, ValueError, ImportError, TypeError)):
        sampler = build_sampler(data, train_set)
    train = PromptLoader(train_set, data.gen_batch_size, shuffle=data.shuffle, seed=seed, sampler=sampler,
                         batch_key="data.gen_batch_size" if cfg.algorithm.filter_groups.enable else "data.train_batch_size")
    val = None
    if data.val_files:
        val_set = dataset(data.val_files, data.val_max_samples, [*agents, *rule], "data.val_files")
        # data.validation_shuffle: a seeded order, drawn afresh for each validation pass (PromptLoader's epochs).
        val = PromptLoader(val_set, data.val_batch_size or len(val_set), shuffle=data.validation_shuffle, seed=seed, drop_last=False)
    return tokenizer, train, val


def check_teacher_tokenizers(cfg: DictConfig, tokenizer) -> None:
    """Before Ray starts: every distillation teacher must read the student's token ids as the student does."""
    if not cfg.distillation.enabled:
        return
    problems = []
    for name, teacher in teacher_entries(cfg).items():
        key = f"distillation.teacher_models.{name}.model_path"
        with loading(key, teacher.model_path, "the teacher's tokenizer"):
            mismatch = tokenizer_mismatch(tokenizer, load_tokenizer(teacher.model_path, teacher.trust_remote_code))
        if mismatch:
            problems.append(f"{key}={teacher.model_path}: {mismatch}; a teacher scores the student's own token ids, so it "
                            "must share the student's tokenizer (pick a teacher of the same family)")
    if problems:
        raise ConfigError(problems)


def build_reward_fns(cfg: DictConfig, tokenizer) -> tuple[RewardManager, RewardManager]:
    fn = cfg.reward.custom_reward_function
    with loading("reward.custom_reward_function.path", fn.path, "the reward function"):
        custom = load_custom_reward_fn(fn.path, fn.name)
    kwargs = plain(cfg.reward.reward_kwargs)
    overlong = cfg.reward_model.overlong_buffer
    if overlong.enable:  # verl's DAPO-recipe form of the same punishment
        kwargs = {"max_resp_len": cfg.data.max_response_length,
                  "overlong_buffer_cfg": {"enable": True, "len": overlong.len, "penalty_factor": overlong.penalty_factor, "log": overlong.log}}
    r, name = cfg.reward_model, cfg.reward.reward_manager.name
    if name == "gdpo":  # verl's gdpo manager tells the scorer the run's name (its example scorer reads it)
        kwargs = {**kwargs, "experiment_name": cfg.trainer.experiment_name}
    scorer = IsolatedScorer(custom or default_compute_score, fn.path, fn.name, r.score_workers, r.score_timeout_s)
    manager = build_reward_manager(name, tokenizer, custom, cfg.data.reward_fn_key, kwargs, scorer,
                                   ScoreGuard(r.error_score, r.max_error_rate))
    return manager, manager


def total_training_steps(cfg: DictConfig, train_loader: PromptLoader) -> int:
    if cfg.trainer.total_training_steps:
        return int(cfg.trainer.total_training_steps)
    return len(train_loader) * cfg.trainer.total_epochs
