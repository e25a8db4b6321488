"""rlcore-plan: the whole report in one run, import-light and fast, and an exit status scripts can use."""

import os
import subprocess
import sys
import time
from pathlib import Path

from rlcore.cli.plan import main, parse_args

REPO = Path(__file__).resolve().parents[2]


def test_recipe_report_has_every_section_and_passes(capsys):
    start = time.perf_counter()
    assert main(["--elsewhere", "recipe=qwen2_7b_grpo"]) == 0
    assert time.perf_counter() - start < 5
    out = capsys.readouterr().out
    assert any(line.split()[2:4] == ["samples_per_step", "5120"] for line in out.splitlines())
    assert "memory plan: 80.0 GiB per device (trainer.device_memory_gb)" in out
    for role in ("rollout", "actor update", "reference log-probs"):
        assert any(line.startswith(f"memory plan: {role} ") and line.rstrip().endswith("fits") for line in out.splitlines())
    assert out.splitlines()[-1] == "rlcore-plan: OK, 0 errors, every phase fits"  # the verdict, last
    assert "speed:" not in out  # 80 GiB: nothing to spare for speed (tests/plan/test_speed.py)
    assert main(["--elsewhere", "recipe=qwen2_7b_grpo", "trainer.device_memory_gb=141"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("speed: actor_rollout_ref.actor.ppo_max_token_len_per_gpu=") and lines[-1].startswith("rlcore-plan: OK")


def test_every_violation_at_once_and_failing_status(capsys):
    assert main(["--elsewhere", "recipe=qwen2_7b_grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=300",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=3", "trainer.device_memory_gb=24"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("4 config error(s):")  # TP vs devices and vs heads, the mini-batch vs the batch and vs 8 ranks
    assert "ppo_mini_batch_size=300 does not divide data.train_batch_size=1024" in out
    assert "rollout.tensor_model_parallel_size=3 must divide trainer.n_gpus_per_node=8" in out
    assert "rollout.tensor_model_parallel_size=3 does not split actor_rollout_ref.model.path's 28 attention heads" in out
    assert "OOM; largest lever:" in out  # the memory plan still runs on the 24 GB variant
    assert out.splitlines()[-1] == "rlcore-plan: FAIL, 4 config error(s), over the device memory: rollout, actor update"


def test_megatron_tree_and_options():
    args = parse_args(["--config-name", "ppo_megatron_trainer", "a=1"])
    assert (args.config_name, args.overrides, args.rehearse, args.sweep) == ("ppo_megatron_trainer", ["a=1"], False, False)
    args = parse_args(["--config-name=x", "-m", "--elsewhere", "+b=2"])
    assert (args.config_name, args.overrides, args.sweep, args.elsewhere) == ("x", ["+b=2"], True, True)


def test_runs_as_a_script_without_ray():
    # torch is imported for the registries' names (the same check rlcore-train runs); Ray never is.
    code = ("import sys; from rlcore.cli.plan import main; rc = main(['recipe=llama_70b_multinode']); "
            "assert 'ray' not in sys.modules; sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "70.55B params" in done.stdout


def test_reward_model_and_sft_configs_are_planned_as_their_one_training_role():
    code = ("import sys; from rlcore.cli.plan import main; rc = main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules; sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = lambda *args: subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)  # noqa: E731
    fits = run("--config-name", "rm_llama3_8b_lora")
    assert fits.returncode == 0, fits.stderr
    assert "memory plan: reward model update " in fits.stdout and " fits" in fits.stdout
    oom = run("--config-name=rm_llama3_8b_lora", "data.max_length=8192", "model.lora_rank=0", "data.train_batch_size=50")
    assert oom.returncode == 1 and oom.stdout.startswith("1 config error(s):") and "OOM; largest lever:" in oom.stdout
    sft = run("--config-name", "sft_trainer", "data.max_length=2048", "data.micro_batch_size_per_gpu=2", "trainer.device_memory_gb=80",
              "model.partial_pretrain=/models/Qwen2.5-7B-Instruct")
    assert sft.returncode == 0 and "memory plan: SFT update " in sft.stdout, sft.stdout + sft.stderr


def test_bad_key_is_a_clear_message_not_a_traceback(capsys):
    assert main(["actor_rollout_ref.actor.ppo_mini_batchsize=4"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("rlcore-plan: the config does not compose:") and "ppo_mini_batchsize" in captured.err
    # the rest of the command line is still checked and planned, and the sentence about it ends
    assert main(["--elsewhere", "recipe=qwen2_7b_grpo", "actor_rollout_ref.actor.ppo_mini_batchsize=4"]) == 1
    captured = capsys.readouterr()
    assert "the rest has 0 config error(s) of its own\n" in captured.err
    assert "memory plan: actor update " in captured.out
    assert captured.out.splitlines()[-1] == "rlcore-plan: FAIL, 1 override(s) refused"
