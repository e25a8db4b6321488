"""verl's Ulysses example command lines, as written: the deepseek-7B PPO example (actor and critic at sp=2) and the
DAPO Qwen2.5-32B recipe (sp=8, 20k-token responses) compose, validate and plan; the PPO one runs on the tiny model
with only its model paths, data files and sizes pointed at this machine (2 CPU ranks: sp=2 is one replica)."""

import math

import pytest
from e2e_utils import tiny_cfg

from rlcore.config import compose
from rlcore.config.validate import diagnose
from rlcore.plan import memory_plan
from rlcore.train import run

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the pytest run's Ray cluster (tests/conftest.py)

# examples/ppo_trainer/run_deepseek7b_llm_sp2.sh (verl 0.5; the KL lines as its config tree names them)
VERL_PPO_SP2 = """
data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet data.train_batch_size=1024
data.max_prompt_length=512 data.max_response_length=512 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64
actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64
actor_rollout_ref.ref.fsdp_config.param_offload=True critic.optim.lr=1e-5 critic.ulysses_sequence_parallel_size=2
critic.model.use_remove_padding=True critic.model.path=deepseek-ai/deepseek-llm-7b-chat
critic.model.enable_gradient_checkpointing=True critic.ppo_micro_batch_size_per_gpu=64
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.optimizer_offload=False
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console','wandb']
trainer.project_name='verl_example_gsm8k' trainer.experiment_name='deepseek_llm_7b_function_rm_sp2'
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=15
""".split()


def test_verl_ppo_sp2_example_composes_validates_and_plans():
    cfg = compose(VERL_PPO_SP2)
    plan, errors = diagnose(cfg)
    assert errors == [] and plan.dp_size == 4  # 8 GPUs / sp 2
    mem = memory_plan(cfg, plan)
    assert {r.role for r in mem.roles} >= {"rollout", "actor update", "critic update"} and all(r.verdict for r in mem.roles)
    actor = dict(next(r for r in mem.roles if r.role == "actor update").items)
    # 32 samples x 1024 tokens per micro-batch, half of them on each rank of the sp group
    assert any(k.startswith("activations, 16384 tokens (1/2 of each micro-batch: Ulysses)") for k in actor), actor


def test_verl_dapo_32b_sp8_plans_with_a_verdict():
    from pathlib import Path
    lines = (Path(__file__).parent / "verl_dapo_qwen2_5_32b.args").read_text().splitlines()
    script = [line for line in lines if line and not line.startswith("#")]
    cfg = compose(script)
    plan, errors = diagnose(cfg)
    assert errors == [] and plan.dp_size == 16  # 16 nodes x 8 GPUs / sp 8
    mem = memory_plan(cfg, plan)
    verdicts = {r.role: r.verdict for r in mem.roles}
    assert verdicts == {"rollout": "fits", "actor update": "fits"}, verdicts
    actor = dict(next(r for r in mem.roles if r.role == "actor update").items)
    assert any("22528 tokens (1/8 of each micro-batch: Ulysses)" in k for k in actor), actor


# What a 2-core machine needs changed: where the model and data are, how many devices, and sizes that fit them.
# Every key of the example is kept; the rollout is the native engine (vLLM runs in its own venv, tests/rollout).
ON_THIS_MACHINE = {
    "data.train_batch_size": "8", "data.max_prompt_length": "8", "data.max_response_length": "5",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16", "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "actor_rollout_ref.rollout.name": "native", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
    "critic.ppo_micro_batch_size_per_gpu": "8", "trainer.logger": "['console']", "trainer.n_gpus_per_node": "2",
    "trainer.test_freq": "-1", "trainer.total_epochs": "1", "actor_rollout_ref.model.enable_gradient_checkpointing": "True",
}


@pytest.mark.slow
def test_verl_ppo_sp2_example_runs_on_the_tiny_model(tiny_model_dir, tiny_task_dir, tmp_path):
    paths = {"data.train_files": f"{tiny_task_dir}/train.parquet", "data.val_files": f"{tiny_task_dir}/test.parquet",
             "actor_rollout_ref.model.path": tiny_model_dir, "critic.model.path": tiny_model_dir}
    overrides = []
    for item in VERL_PPO_SP2:
        key, value = item.split("=", 1)
        overrides.append(f"{key}={paths.get(key, ON_THIS_MACHINE.get(key, value))}")
    cfg = tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *overrides, "algorithm.adv_estimator=gae",
                   "trainer.total_training_steps=2", "trainer.val_before_train=False")
    plan, errors = diagnose(cfg)
    assert errors == [] and plan.dp_size == 1
    final = run(cfg, str(tmp_path / "run"))
    for key in ("actor/pg_loss", "critic/vf_loss", "critic/values/mean", "actor/entropy"):
        assert math.isfinite(final[key]), (key, final)
