"""The checks both doors run: `rlcore-train` before Ray starts and `rlcore-plan` as the doctor, from this one place.

Beyond the schema's rules (rlcore.config.validate.diagnose) they need what the config package must not import: the
registries (advantage estimators, policy losses, KL estimators, loss aggregations, and what a custom_algorithms
file adds to them), the files and directories the run reads on this machine (models, tokenizers, data, reward
functions), the model's own config.json and the tracker packages. Every message is one line naming the key, the
bad value and a fix.

`where="train"` makes every missing path an error: the driver reads the data and the tokenizer itself, and a worker
on this machine reads the model. `where="plan"` makes it a warning when the path looks remote (`hdfs://`, `s3://`)
or the run spans several nodes; `where="elsewhere"` (`rlcore-plan --elsewhere`: planning on a laptop a job that
will run on another machine) makes every missing path a warning.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from rlcore.config.distill_schema import distillation_warnings
from rlcore.config.files import file_list
from rlcore.config.tool_config import tool_config_key_of, tools_enabled
from rlcore.config.validate import uses_critic

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class Preflight:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def preflight(cfg: DictConfig, where: str, known: list[str] = ()) -> Preflight:
    """What the schema's rules cannot see; `where` is "train", "plan" or "elsewhere" (see the module docstring).
    `known`: the schema's errors, so a key both refuse is reported once."""
    out = Preflight()
    out.errors += [e for e in registry_errors(cfg) if not any(k.startswith(e.split("=", 1)[0] + "=") for k in known)]
    _paths(cfg, where, out)
    from rlcore.telemetry.tracking import logger_errors, logger_names

    out.errors += logger_errors(logger_names(cfg.trainer.logger))
    if "distillation" in cfg:  # the PPO trainer's (the SFT and reward-model trainers have none)
        from rlcore.config.validate import config_warnings

        out.warnings += distillation_warnings(lambda key: OmegaConf.select(cfg, key)) + config_warnings(cfg)
    if where == "train" and cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            out.errors.append("trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu to run on CPU (gloo)")
    return out


def registry_errors(cfg: DictConfig) -> list[str]:
    """Every pluggable name against its registry, after a custom_algorithms file had its chance to register."""
    from rlcore.algos import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
    from rlcore.algos.custom import load_custom_algorithms

    errors = []
    try:
        load_custom_algorithms(cfg.custom_algorithms.path)  # before the name checks: it registers names
    except (OSError, ImportError, ValueError) as err:
        errors.append(_one_line(err))
    actor = "actor_rollout_ref.actor"
    for registry, key in ((ADV_ESTIMATORS, "algorithm.adv_estimator"), (POLICY_LOSSES, f"{actor}.policy_loss.loss_mode"),
                          (KL_ESTIMATORS, f"{actor}.kl_loss_type"), (KL_ESTIMATORS, "algorithm.kl_penalty"),
                          (LOSS_AGGREGATIONS, f"{actor}.loss_agg_mode")):
        value = OmegaConf.select(cfg, key)
        if value not in registry:
            errors.append(registry_message(registry, key, value))
    return errors


def registry_message(registry, key: str, value) -> str:
    import difflib

    names = registry.names()
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.75)
    hint = f"did you mean {key}={close[0]}? " if close else ""
    return f"{key}={value!r} is not a registered {registry.kind}; {hint}valid: {', '.join(names)}"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _remote(path: str) -> bool:
    return "://" in str(path) and not str(path).startswith("pkg://")  # pkg://: verl's importable-module form


def _paths(cfg: DictConfig, where: str, out: Preflight) -> None:
    """Models (config.json readable, an architecture the engine can build), tokenizers, data files and user files."""
    multi_node = cfg.trainer.nnodes > 1

    def missing(key: str, value, what: str) -> None:
        soft = where == "elsewhere" or where == "plan" and (_remote(value) or multi_node)
        reason = ("a remote path" if _remote(value) else "not checked on the other nodes" if multi_node
                  else "--elsewhere: the job runs on another machine")
        if soft:
            out.warnings.append(f"{key}={value}: {what} on this machine ({reason}; rlcore reads local paths only, so it "
                                "must exist on every node that runs the job)")
        else:
            fix = " (a remote URL: copy it to local disk first, rlcore reads local paths only)" if _remote(value) else ""
            out.errors.append(f"{key}={value}: {what}{fix}; " + _fix_for(key, value))

    ar = cfg.actor_rollout_ref
    tp = lambda role: role.megatron.tensor_model_parallel_size if role.strategy == "megatron" else 1  # noqa: E731
    models = [("actor_rollout_ref.model.path", ar.model.path, ar.actor.strategy, ar.rollout.name, tp(ar.actor))]
    if uses_critic(cfg):
        models.append(("critic.model.path", cfg.critic.model.path, cfg.critic.strategy, None, tp(cfg.critic)))
    if cfg.reward.reward_model.enable:
        models.append(("reward.reward_model.model_path", cfg.reward.reward_model.model_path, cfg.reward_model.strategy, None, 1))
    for key, path, strategy, rollout, tensor_parallel in models:
        _model_dir(key, path, strategy, rollout, tensor_parallel, missing, out)
    tokenizer_key = "actor_rollout_ref.model.tokenizer_path" if ar.model.tokenizer_path else "actor_rollout_ref.model.path"
    tokenizer_dir = ar.model.tokenizer_path or ar.model.path
    full = os.path.expanduser(str(tokenizer_dir))
    if os.path.isdir(full) and not any(os.path.isfile(os.path.join(full, name)) for name in TOKENIZER_FILES):
        missing(tokenizer_key, tokenizer_dir, f"no tokenizer in {full} (none of {', '.join(TOKENIZER_FILES)})")
    elif ar.model.tokenizer_path and not os.path.isdir(full):
        missing(tokenizer_key, tokenizer_dir, "no such directory")
    if cfg.reward.reward_model.enable and cfg.reward_model.model.input_tokenizer:
        value = cfg.reward_model.model.input_tokenizer  # the policy's tokenizer, read by the reward model's workers
        if not os.path.isdir(os.path.expanduser(str(value))):
            missing("reward_model.model.input_tokenizer", value, "no such directory")
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key)
        for path in file_list(value):
            if not os.path.isfile(os.path.expanduser(str(path))):
                missing(key, path, "no such file")
    if cfg.global_profiler.tool == "nsys" and shutil.which("nsys") is None:
        missing("global_profiler.tool", "nsys", "Nsight Systems is not installed (no nsys on PATH)")
    tools_key = tool_config_key_of(cfg) if tools_enabled(cfg) else None
    tools_file = OmegaConf.select(cfg, tools_key) if tools_key else None
    if tools_file and not os.path.isfile(os.path.expanduser(str(tools_file))):
        missing(tools_key, tools_file, "no such file")
    for key in ("multi_turn.interaction_config_path", "agent.agent_loop_config_path"):
        value = OmegaConf.select(ar.rollout, key)
        if value and not os.path.isfile(os.path.expanduser(str(value))):
            missing(f"actor_rollout_ref.rollout.{key}", value, "no such file")
    _sampler(cfg.data.sampler, missing, out)
    reward_file = cfg.reward.custom_reward_function.path
    if reward_file:
        if not os.path.isfile(os.path.expanduser(str(reward_file))):
            missing("reward.custom_reward_function.path", reward_file, "no such file")
        else:
            from rlcore.reward.custom import load_custom_reward_fn

            try:
                load_custom_reward_fn(reward_file, cfg.reward.custom_reward_function.name)
            except (OSError, ImportError, ValueError) as err:
                out.errors.append(_one_line(err))


def _sampler(sampler, missing, out: Preflight) -> None:
    """data.sampler: a class named in a file that exists, or in a module that imports (pkg://)."""
    key, path = "data.sampler.class_path", sampler.class_path
    if path is None:
        if sampler.class_name is not None:
            out.errors.append(f"data.sampler.class_name={sampler.class_name} without data.sampler.class_path: set the file "
                              "(or pkg://module) that defines it, or drop class_name")
        return
    if sampler.class_name is None:
        out.errors.append(f"{key}={path} without data.sampler.class_name: name the sampler class defined there")
    if path.startswith("pkg://"):
        import importlib.util

        try:
            found = importlib.util.find_spec(path.removeprefix("pkg://")) is not None
        except ImportError:  # a parent package that does not import
            found = False
        if not found:
            missing(key, path, "no such module on the Python path")
    elif not os.path.isfile(os.path.expanduser(path)):
        missing(key, path, "no such file")


def _model_dir(key: str, path, strategy: str, rollout: str | None, tensor_parallel: int, missing, out: Preflight) -> None:
    from rlcore.families import family_problems

    full = os.path.expanduser(str(path))
    config_file = os.path.join(full, "config.json")
    if not os.path.isdir(full):
        missing(key, path, "no such directory")
        return
    if not os.path.isfile(config_file):
        missing(key, path, f"no config.json in {os.path.abspath(full)} (rlcore loads HF save_pretrained directories)")
        return
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        out.errors.append(f"{key}={path}: {config_file} is not readable JSON ({_one_line(err)}); fix or replace the file")
        return
    out.errors += [f"{key}={path}: {problem}" for problem in family_problems(config, strategy, rollout, tensor_parallel)]
    if key != "actor_rollout_ref.model.path" and "vision_config" in config:  # a critic or reward model: a scalar head
        out.errors.append(f"{key}={path}: a vision-language checkpoint ({config.get('model_type')}) as a value or reward model is not "
                          "supported yet (rlcore's scalar heads sit on text models: transformers has no token-classification "
                          "class for it); use a text-only checkpoint there, or a critic-free estimator (algorithm.adv_estimator=grpo)")
    generative = [a for a in config.get("architectures") or [] if a.endswith(("ForCausalLM", "ForConditionalGeneration"))]
    if key == "reward.reward_model.model_path" and generative and len(generative) == len(config["architectures"]):
        # its score head would be built at random: every score noise, and the run would train on it
        out.errors.append(f"{key}={path}: a generative model ({generative[0]}), not a reward model: verl 0.9 runs such a judge "
                          "through its reward loop only for a reward function of yours that prompts it; rlcore's reward model "
                          "is a *ForSequenceClassification (one label) scored at the last token. Use such a model (rlcore-rm "
                          "trains one), or call your judge from a reward.custom_reward_function")
    if not any(name.endswith((".safetensors", ".bin")) for name in os.listdir(full)):
        # a config-only copy is how a model is planned on a laptop (--elsewhere): a warning there
        missing(key, path, f"no weights in {os.path.abspath(full)} (no *.safetensors or *.bin: a download of the config alone?)")
    out.errors += [f"{key}={path}: {problem}" for problem in _unreadable_shards(full)]


def _unreadable_shards(full: str) -> list[str]:
    """safetensors files whose header does not parse or promises more bytes than the file has (an interrupted
    download): read from each file's first bytes only, so a 70B checkpoint costs milliseconds."""
    from safetensors import safe_open

    problems = []
    for name in sorted(n for n in os.listdir(full) if n.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(full, name), framework="numpy") as shard:
                shard.keys()
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
            problems.append(f"{name} does not load ({type(err).__name__}: {_one_line(err)[:200]}); download it again")
    return problems


# The embedded demos' assets and the make target that builds them.
DEMO_BUILDERS = ((".cache/tiny_tools", "make train-tools"), (".cache/tiny_cpu/reward_model", "make train-rm"),
                 (".cache/tiny_cpu/rm_", "make train-rm"), (".cache/tiny_cpu", "make train"))


def _fix_for(key: str, value) -> str:
    demo = next((target for prefix, target in DEMO_BUILDERS if prefix in str(value)), None)
    if demo:
        return f"the demo's assets are built by `{demo}` (run it once from the repository root, where these paths are relative)"
    if key == "data.sampler.class_path":
        return f"point {key} at the Python file that defines the sampler, or pkg://module for an importable one"
    if key.startswith("data."):
        return f"point {key} at local parquet files (docs/gpu_start.md prepares GSM8K in verl's row format)"
    if key == "global_profiler.tool":
        return "install Nsight Systems (nsys on PATH) on every node that runs the job, or use global_profiler.tool=torch"
    if key.endswith("tool_config_path"):
        return f"point {key} at a tool config such as tool_configs/gsm8k_calculator.yaml"
    if key.endswith("interaction_config_path"):
        return f"point {key} at an interaction config such as interactions/tiny_add.yaml"
    if key.endswith("agent_loop_config_path"):
        return f"point {key} at an agent-loop config such as agent_loops/retry.yaml"
    if key.endswith("model.path") or key.endswith("tokenizer_path"):
        return f"point {key} at a local HF model directory (e.g. `hf download Qwen/Qwen2.5-7B-Instruct --local-dir ...`)"
    return f"set {key} to an existing file or null"
