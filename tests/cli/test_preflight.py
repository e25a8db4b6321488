"""One check, two doors: what rlcore-train refuses before Ray starts, rlcore-plan refuses too, in one line per problem.

The first-contact cases of issue 33, each through both doors: the doctor (`rlcore.cli.plan.main`) and the training
entry point as a user runs it (`python -m rlcore.train`, a subprocess: no traceback, the key named)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore.cli.plan import main as plan
from rlcore.cli.preflight import preflight
from rlcore.config import compose

REPO = Path(__file__).resolve().parents[2]


def tiny(tiny_model_dir, tiny_task_dir, *extra):
    return ["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files={tiny_task_dir}/train.parquet", f"data.val_files={tiny_task_dir}/test.parquet", *extra]


def errors(overrides, where="plan"):
    return preflight(compose(overrides), where).errors


def test_a_valid_tiny_config_passes_both_doors(tiny_model_dir, tiny_task_dir, capsys):
    assert errors(tiny(tiny_model_dir, tiny_task_dir), "train") == []
    assert plan(tiny(tiny_model_dir, tiny_task_dir)) == 0


@pytest.mark.parametrize("extra, message", [
    (["algorithm.adv_estimator=grpoo"], "algorithm.adv_estimator='grpoo' is not a registered advantage estimator; did you mean "
                                        "algorithm.adv_estimator=grpo? valid: "),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=vanila"], "actor_rollout_ref.actor.policy_loss.loss_mode='vanila' is not a "
                                                               "registered policy loss; did you mean actor_rollout_ref.actor.policy_loss.loss_mode=vanilla?"),
    (["data.train_files=/nonexistent/train.parquet"], "data.train_files=/nonexistent/train.parquet: no such file; point "
                                                      "data.train_files at local parquet files"),
    (["actor_rollout_ref.model.path=/nonexistent/model"], "actor_rollout_ref.model.path=/nonexistent/model: no such directory; point "
                                                          "actor_rollout_ref.model.path at a local HF model directory"),
    (["reward.custom_reward_function.path=/nonexistent/reward.py"], "reward.custom_reward_function.path=/nonexistent/reward.py: no such file"),
    (["trainer.logger=[console,swanlab]"], "trainer.logger=['console', 'swanlab']: unknown logger(s) ['swanlab']"),
])
def test_the_doctor_refuses_what_training_refuses(tiny_model_dir, tiny_task_dir, capsys, extra, message):
    overrides = tiny(tiny_model_dir, tiny_task_dir, *extra)
    assert [e for e in errors(overrides, "train") if e.startswith(message)], errors(overrides, "train")
    assert plan(overrides) == 1
    out = capsys.readouterr().out
    assert out.startswith("1 config error(s):") and f"  1. {message}" in out


def test_model_directory_problems_name_the_key(tiny_model_dir, tiny_task_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "config.json").write_text("{not json")
    assert [e for e in errors(tiny(broken, tiny_task_dir)) if e.startswith(f"actor_rollout_ref.model.path={broken}: ")
            and "is not readable JSON" in e]
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(Path(tiny_model_dir) / "config.json", config_only / "config.json")
    found = errors(tiny(config_only, tiny_task_dir))
    assert any("no weights in" in e for e in found) and any("no tokenizer in" in e for e in found), found
    # planned for another machine, a config-only copy is enough (the shapes come from it)
    assert errors(tiny(config_only, tiny_task_dir), "elsewhere") == []
    # a vision-language checkpoint trains as the policy, not (yet) as PPO's critic: refused before Ray starts
    vl = tmp_path / "vl"
    vl.mkdir()
    (vl / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {}, "text_config": {"model_type": "qwen2_5_vl_text"}}))
    found = errors(tiny(tiny_model_dir, tiny_task_dir, "algorithm.adv_estimator=gae", f"critic.model.path={vl}"), "elsewhere")
    assert [e for e in found if e.startswith(f"critic.model.path={vl}: a vision-language checkpoint (qwen2_5_vl) as a value")], found


def test_remote_or_multi_node_paths_are_warnings_in_the_plan_and_errors_in_training(tiny_model_dir, tiny_task_dir):
    remote = tiny(tiny_model_dir, tiny_task_dir, "data.train_files=hdfs://cluster/gsm8k/train.parquet")
    checked = preflight(compose(remote), "plan")
    assert not checked.errors and checked.warnings[0].startswith("data.train_files=hdfs://cluster/gsm8k/train.parquet: "
                                                                 "no such file on this machine (a remote path")
    assert "copy it to local disk first" in errors(remote, "train")[0]
    multi = tiny(tiny_model_dir, tiny_task_dir, "trainer.nnodes=2", "data.val_files=/elsewhere/test.parquet")
    checked = preflight(compose(multi), "plan")
    assert not checked.errors and "not checked on the other nodes" in checked.warnings[0]


def test_a_missing_tool_config_is_a_path_like_the_others(tiny_model_dir, tiny_task_dir):
    # verl's multi-turn scripts name a tool config on the user's machine: planned --elsewhere it is a warning, as a
    # missing model or data file is; planned or trained here, an error with the fix.
    MT = "actor_rollout_ref.rollout.multi_turn"
    args = tiny(tiny_model_dir, tiny_task_dir, f"{MT}.enable=True", f"{MT}.tool_config_path=/nowhere/tools.yaml")
    elsewhere = preflight(compose(args), "elsewhere")
    assert not elsewhere.errors and elsewhere.warnings == [
        f"{MT}.tool_config_path=/nowhere/tools.yaml: no such file on this machine (--elsewhere: the job runs on another "
        "machine; rlcore reads local paths only, so it must exist on every node that runs the job)"]
    assert errors(args, "train") == [f"{MT}.tool_config_path=/nowhere/tools.yaml: no such file; point {MT}.tool_config_path "
                                     "at a tool config such as tool_configs/gsm8k_calculator.yaml"]
    from rlcore.config.validate import diagnose

    assert not [e for e in diagnose(compose(args))[1] if "tool_config_path" in e]  # the rules leave the path to preflight


def test_a_reward_file_that_fails_to_import_is_one_line(tiny_model_dir, tiny_task_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("import not_a_module_anywhere\n")
    found = errors(tiny(tiny_model_dir, tiny_task_dir, f"reward.custom_reward_function.path={reward}"), "train")
    assert found == [f"reward.custom_reward_function.path={reward} failed to load: ModuleNotFoundError: No module named 'not_a_module_anywhere'"]


def test_a_data_sampler_names_a_file_or_an_importable_module_and_a_class(tiny_model_dir, tiny_task_dir):
    """data.sampler (verl's curriculum sampler): missing pieces are errors here and warnings when the job runs
    elsewhere (verl's own example names a module of its test tree: pkg://tests.utils.dataset...)."""
    S = "data.sampler"
    module = tiny(tiny_model_dir, tiny_task_dir, f"{S}.class_path=pkg://tests.utils.dataset.sampler_here", f"{S}.class_name=MySampler")
    assert errors(module) == [f"{S}.class_path=pkg://tests.utils.dataset.sampler_here: no such module on the Python path; point "
                              f"{S}.class_path at the Python file that defines the sampler, or pkg://module for an importable one"]
    assert preflight(compose(module), "elsewhere").warnings[0].startswith(f"{S}.class_path=pkg://tests.utils.dataset.sampler_here: "
                                                                          "no such module on the Python path on this machine (--elsewhere")
    assert errors(tiny(tiny_model_dir, tiny_task_dir, f"{S}.class_path={__file__}")) == [
        f"{S}.class_path={__file__} without {S}.class_name: name the sampler class defined there"]
    assert errors(tiny(tiny_model_dir, tiny_task_dir, f"{S}.class_name=MySampler")) == [
        f"{S}.class_name=MySampler without {S}.class_path: set the file (or pkg://module) that defines it, or drop class_name"]


def test_heads_against_tensor_parallel_sizes(capsys):
    assert plan(["--elsewhere", "recipe=qwen2_7b_grpo", "actor_rollout_ref.rollout.tensor_model_parallel_size=8"]) == 1
    out = capsys.readouterr().out
    assert ("actor_rollout_ref.rollout.tensor_model_parallel_size=8 does not split actor_rollout_ref.model.path's 28 attention "
            "heads / 4 KV heads (vLLM needs heads % TP == 0, and KV heads % TP == 0 or TP % KV heads == 0); use "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4") in out
    assert plan(["--elsewhere", "--config-name", "ppo_megatron_trainer", "recipe=qwen2_7b_grpo",
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8"]) == 1
    out = capsys.readouterr().out
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8 does not split" in out and "megatron-core needs both" in out


def train(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    return subprocess.run([sys.executable, "-m", "rlcore.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_training_names_a_missing_actor_model_in_one_line_without_a_traceback(tiny_task_dir):
    done = train("recipe=tiny_cpu", "actor_rollout_ref.model.path=/nonexistent/model",
                 f"data.train_files={tiny_task_dir}/train.parquet", f"data.val_files={tiny_task_dir}/test.parquet")
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "rlcore: invalid configuration\n1 config error(s):\n  1. actor_rollout_ref.model.path=/nonexistent/model: no such directory" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["recipe=qwen2_7b_gpro"], "rlcore: the config does not compose: recipe=qwen2_7b_gpro is not one of the recipe options; "
                               "did you mean recipe=qwen2_7b_grpo? available: gemma2_2b_ppo, llama3_8b_rm_lora, "),
    (["actor_rollout_ref.rollout.gpu_memory_utilisation=0.6"], "rlcore: the config does not compose: actor_rollout_ref.rollout."
                                                               "gpu_memory_utilisation is not a config key; did you mean "
                                                               "actor_rollout_ref.rollout.gpu_memory_utilization?"),
    (["data.train_files=~/data/gsm8k/train.parquet"], "rlcore: the config does not compose: data.train_files=~/data/gsm8k/train.parquet: "
                                                      "Hydra's override grammar refuses an unquoted ~ in a value; "
                                                      "write data.train_files=$HOME/data/gsm8k/train.parquet"),
    (["-m", "recipe=tiny_cpu", "actor_rollout_ref.rolout.n=4,8"], "rlcore: the config does not compose: actor_rollout_ref.rolout.n "
                                                                   "is not a config key; did you mean actor_rollout_ref.rollout.n?"),
])
def test_training_explains_a_command_line_that_does_not_compose(args, message):
    done = train(*args)
    assert done.returncode == 1 and done.stderr.startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_plus_key_typo_is_refused_by_both_doors(tiny_model_dir, tiny_task_dir, capsys):
    typo = tiny(tiny_model_dir, tiny_task_dir, "+actor_rollout_ref.rollout.gpu_memory_utilisation=0.6")
    assert plan(typo) == 1
    assert ("actor_rollout_ref.rollout.gpu_memory_utilisation is not a config key (`+` adds a key, but this section's keys are "
            "fixed); did you mean actor_rollout_ref.rollout.gpu_memory_utilization?") in capsys.readouterr().out
    done = train(*typo)
    assert done.returncode == 1 and "did you mean actor_rollout_ref.rollout.gpu_memory_utilization?" in done.stderr


def test_data_that_exists_but_does_not_load_names_its_key(tiny_model_dir, tmp_path):
    from rlcore.config import ConfigError
    from rlcore.trainer.setup import build_data

    bad = tmp_path / "train.parquet"
    bad.write_text("this is not parquet")
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={bad}", "data.val_files=null"])
    with pytest.raises(ConfigError, match=rf"data.train_files={bad}: the data does not load: ArrowInvalid: "):
        build_data(cfg)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.tokenizer_path={tokenizer}"])
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref.model.tokenizer_path={tokenizer}: the tokenizer does not load: "):
        build_data(cfg)
    assert json.loads((tokenizer / "tokenizer.json").read_text()) == {}  # nothing the user had is touched


def test_an_interrupted_download_is_named_before_launch(tiny_model_dir, tiny_task_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    shard = model / "model.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    [error] = errors(tiny(model, tiny_task_dir), "train")
    assert error.startswith(f"actor_rollout_ref.model.path={model}: model.safetensors does not load (SafetensorError: ")
    assert error.endswith("download it again")


def test_a_model_that_fails_inside_the_workers_is_one_line_naming_its_key(ray_cluster, tiny_model_dir, tiny_task_dir, tmp_path):
    """In-process, on the session's cluster: the exit path is run()'s own SystemExit (Python prints its one line and
    no traceback, as test_training_names_a_missing_actor_model_in_one_line_without_a_traceback checks through a
    subprocess); a subprocess would only add a cluster and an interpreter start (~11 s)."""
    from safetensors.torch import load_file, save_file

    from rlcore.train import run

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tensors = load_file(str(model / "model.safetensors"))
    del tensors["model.layers.0.mlp.down_proj.weight"]  # a valid file without one tensor: only loading finds it
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SystemExit) as info:
        run(compose(tiny(model, tiny_task_dir, "trainer.total_training_steps=1", "reward_model.score_workers=0",
                         f"trainer.default_local_dir={tmp_path}/ckpt")), str(tmp_path / "run"))
    assert info.value.__suppress_context__ and str(info.value) == (
        f"rlcore: actor_rollout_ref.model.path={model}: the model does not load: KeyError: "
        "'the checkpoint has no tensor for model.layers.0.mlp.down_proj.weight'")


def test_a_generative_model_as_the_reward_model_is_refused_naming_the_judge_route(tiny_model_dir, tiny_task_dir):
    """verl 0.9's reward.reward_model may name a generative judge (served by its reward loop for a reward function of
    the user's); rlcore's reward model is a scalar scorer, and a causal LM's score head would be random."""
    found = errors(tiny(tiny_model_dir, tiny_task_dir, "reward.reward_model.enable=True", f"reward.reward_model.model_path={tiny_model_dir}"))
    assert len(found) == 1 and found[0].startswith(f"reward.reward_model.model_path={tiny_model_dir}: a generative model (")
    assert "reward.custom_reward_function" in found[0]
