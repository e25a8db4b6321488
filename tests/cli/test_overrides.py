"""Command lines the way Hydra composes them, explained in one line when they do not; the doctor's sweeps."""

import pytest

from rlcore.cli.overrides import ComposeError, compose_explained, expand_sweep, set_existing_keys, split_argv, varying
from rlcore.cli.plan import main as plan
from rlcore.config import compose


def refusal(overrides):
    with pytest.raises(ComposeError) as err:
        compose_explained(compose, overrides)
    return str(err.value)


def test_group_options_keys_tildes_and_commas_are_explained():
    assert refusal(["recipe=tiny_cpu_ppp"]).startswith("recipe=tiny_cpu_ppp is not one of the recipe options; did you mean "
                                                        "recipe=tiny_cpu_ppo? available: gemma2_2b_ppo, llama3_8b_rm_lora, ")
    assert refusal(["recipe=tiny_cpu", "trainer.n_gpu_per_node=2"]) == "trainer.n_gpu_per_node is not a config key; did you mean trainer.n_gpus_per_node?"
    assert "write data.val_files=$HOME/x.parquet" in refusal(["data.val_files=~/x.parquet"])
    assert refusal(["trainer.device_memory_gb=80,40"]).endswith("to plan or train each value, add -m (a sweep); for a list use key=[a,b]; "
                                                                "for one string with commas quote it: key='a,b'")
    assert refusal(["tools=tiny_add"]).startswith("tools is not a config key")  # tool configs are files, not a group


def test_sweeps_expand_like_hydras_basic_sweeper():
    jobs = expand_sweep(["recipe=tiny_cpu", "a.b=1,2", "c=x,y"])
    assert jobs == [["recipe=tiny_cpu", "a.b=1", "c=x"], ["recipe=tiny_cpu", "a.b=1", "c=y"],
                    ["recipe=tiny_cpu", "a.b=2", "c=x"], ["recipe=tiny_cpu", "a.b=2", "c=y"]]
    assert varying(jobs)[3] == ["a.b=2", "c=y"]
    assert expand_sweep(["a=1", "lr=interval(0, 1)"], basic=False) == [["a=1"]]  # Optuna's search space is Optuna's
    assert split_argv(["-m", "--config-name", "ppo_megatron_trainer", "hydra.run.dir=x", "a=1"], "ppo_trainer") == (
        "ppo_megatron_trainer", ["a=1"], True, True)
    assert split_argv(["--cfg", "job"], "ppo_trainer")[3] is False  # Hydra's questions are left to Hydra


def test_the_doctor_sweeps_and_prints_one_table(capsys):
    code = plan(["--elsewhere", "-m", "recipe=qwen2_7b_grpo", "trainer.device_memory_gb=80,24"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1  # the 24 GB job does not fit
    header = out.index("rlcore-plan sweep summary (2 jobs; per role: peak GiB per device and verdict)")
    assert out[header + 1].split()[:4] == ["#", "overrides", "errors", "rollout"]
    rows = [line.split() for line in out[header + 2:]]
    assert rows[0][:3] == ["0", "trainer.device_memory_gb=80", "0"] and rows[0][-1] == "ok" and "fits" in rows[0]
    assert rows[1][:3] == ["1", "trainer.device_memory_gb=24", "0"] and rows[1][-1] == "FAIL" and "OOM" in rows[1]


def test_a_sweep_job_with_an_error_shows_it_and_fails(capsys):
    assert plan(["--elsewhere", "-m", "recipe=qwen2_7b_grpo", "actor_rollout_ref.rollout.tensor_model_parallel_size=2,8"]) == 1
    out = capsys.readouterr().out
    assert ("job 1 (actor_rollout_ref.rollout.tensor_model_parallel_size=8): error 1: "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=8 does not split") in out


def test_a_value_hydra_cannot_merge_says_why():
    with pytest.raises(ComposeError, match=r"^Error merging override trainer.total_epochs=abc: Value 'abc' of type 'str' "
                                           r"could not be converted to Integer$"):
        compose_explained(compose, ["trainer.total_epochs=abc"])


def test_verls_one_logger_as_a_string_composes_and_is_checked_as_a_list():
    from rlcore.cli.preflight import preflight
    from rlcore.telemetry.tracking import logger_names

    cfg = compose_explained(compose, ["recipe=tiny_cpu", "trainer.logger=console"])
    assert logger_names(cfg.trainer.logger) == ["console"] and logger_names(["console", "jsonl"]) == ["console", "jsonl"]
    assert not preflight(cfg, "elsewhere").errors
    bad = compose_explained(compose, ["recipe=tiny_cpu", "trainer.logger=consol"])
    assert any("unknown logger(s) ['consol']" in e for e in preflight(bad, "elsewhere").errors)


def test_an_unsupported_device_is_a_config_error_not_a_crash(capsys):
    assert plan(["recipe=tiny_cpu", "trainer.device=npu"]) != 0
    assert "trainer.device=npu is not supported by rlcore; use trainer.device=cuda or trainer.device=cpu" in capsys.readouterr().out


def test_every_refusal_at_once_and_the_rest_still_checked(capsys):
    # a verl script pasted as it is: two keys rlcore lacks and a value of the wrong type, reported together
    with pytest.raises(ComposeError) as err:
        compose_explained(compose, ["recipe=tiny_cpu", "actor_rollout_ref.model.mtp.enable=True", "trainer.total_epochs=abc",
                                    "data.bogus_key=1", "actor_rollout_ref.rollout.n=3"])
    assert err.value.problems == [
        "actor_rollout_ref.model.mtp.enable is verl's multi-token prediction (MTP) training and speculative rollout; not "
        "supported by rlcore: not in rlcore yet: its model families have no MTP heads",
        "Error merging override trainer.total_epochs=abc: Value 'abc' of type 'str' could not be converted to Integer",
        "data.bogus_key is not a config key; see rlcore/config/*schema.py (or verl's key tree) for the keys"]
    assert str(err.value).startswith("3 problems:\n  - actor_rollout_ref.model.mtp.enable is verl's")
    assert err.value.partial.actor_rollout_ref.rollout.n == 3  # the overrides that compose still apply
    # rlcore-plan prints them, then the rest's own errors, in one run
    assert plan(["--elsewhere", "recipe=tiny_cpu", "data.bogus_key=1", "data.train_batch_size=7"]) == 1
    err_text = capsys.readouterr().err
    assert "data.bogus_key is not a config key" in err_text and "the rest has" in err_text and "data.train_batch_size=7" in err_text


def test_a_plus_on_a_key_rlcore_has_sets_it():
    # verl's tree lacks data.gen_batch_size, so its DAPO scripts add it with `+`; rlcore's schema has it
    keys = {"data.gen_batch_size", "actor_rollout_ref.actor.fsdp_config.model_dtype"}
    assert set_existing_keys(["+data.gen_batch_size=64", "+reward.reward_kwargs.max_resp_len=8", "++a=1"], keys) == [
        "data.gen_batch_size=64", "+reward.reward_kwargs.max_resp_len=8", "++a=1"]
    assert plan(["--elsewhere", "recipe=tiny_cpu", "+data.gen_batch_size=32"]) == 0  # composes (Hydra alone refuses it)


EXAMPLE_DIR = "tests/config/verl_corpus/configs/examples/sglang_multiturn/config"  # verl's, copied by tools/verl_corpus.py


def test_a_verl_examples_config_folder_composes_onto_rlcores_configs(capsys):
    """verl's example scripts name their own YAML (`--config-path=$PROJECT_DIR/examples/.../config --config-name=
    gsm8k_multiturn_grpo`), which builds on verl's ppo_trainer: rlcore composes it onto its own ppo_trainer (its
    config folder replaces verl's on the YAML's search path), for rlcore-plan and rlcore-train alike; verl's own
    trainer folder (`--config-path=config`) is rlcore's."""
    import os

    from rlcore.cli.overrides import config_dir_of, hydra_argv
    from rlcore.config import CONFIG_DIR

    assert config_dir_of(["--config-path=config", "a=1"]) is None and config_dir_of(["-cp", "./config"]) is None
    assert config_dir_of(["--config-path", EXAMPLE_DIR]) == os.path.abspath(EXAMPLE_DIR)
    assert hydra_argv(["--config-path=config", "--config-name=ppo_megatron_trainer", "a=1"]) == ["--config-name=ppo_megatron_trainer", "a=1"]
    assert hydra_argv(["--config-path", EXAMPLE_DIR, "a=1"]) == [f"--config-path={os.path.abspath(EXAMPLE_DIR)}", "a=1",
                                                                 f"hydra.searchpath=[file://{os.path.abspath(CONFIG_DIR)}]"]
    cfg = compose(["actor_rollout_ref.rollout.name=vllm"], config_name="gsm8k_multiturn_grpo", config_dir=EXAMPLE_DIR)
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5 and cfg.data.train_batch_size == 256  # the YAML's
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.trainer.seed == 1  # the command line's, rlcore's defaults
    run = ["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "trainer.n_gpus_per_node=8",
           "actor_rollout_ref.rollout.multi_turn.tool_config_path=tool_configs/gsm8k_calculator.yaml",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]
    assert plan(["--elsewhere", f"--config-path={EXAMPLE_DIR}", "--config-name", "gsm8k_multiturn_grpo", *run]) == 0
    assert "memory plan:" in capsys.readouterr().out
