"""Shared e2e set-up: the tiny recipe pointed at the test fixtures, small enough for CI."""

from rlcore.config import compose


def tiny_cfg(model_dir, task_dir, out_dir, *overrides, config_name="ppo_trainer"):
    return compose([
        "recipe=tiny_cpu",
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={task_dir}/train.parquet",
        f"data.val_files={task_dir}/test.parquet",
        f"trainer.default_local_dir={out_dir}/ckpt",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        *overrides,
    ], config_name=config_name)
