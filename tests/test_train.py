import pytest

from rlcore.config import ConfigError, compose
from rlcore.train import check_config


def test_schema_and_runtime_problems_are_reported_together():
    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.ppo_mini_batch_size=7", "algorithm.adv_estimator=foo",
                   "actor_rollout_ref.actor.loss_agg_mode=token-max"])
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    text = str(err.value)
    assert "ppo_mini_batch_size=7 does not divide data.train_batch_size=32" in text
    valid = text.split("algorithm.adv_estimator='foo' is not a registered advantage estimator; valid: ")[1].splitlines()[0]
    builtin = {"gae", "gpg", "grpo", "grpo_passk", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"}
    assert builtin <= set(valid.split(", "))  # (plus any a test registered from a file in this process)
    assert "loss_agg_mode" in text and "token-mean" in text


def tiny(model_dir, task_dir, *extra):
    """The tiny recipe on the fixtures' model and data (a fresh clone has no .cache/tiny_cpu: the checks look)."""
    return ["recipe=tiny_cpu", f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={task_dir}/train.parquet",
            f"data.val_files={task_dir}/test.parquet", *extra]


def test_valid_recipe_yields_the_batch_and_memory_plan(tiny_model_dir, tiny_task_dir):
    report = check_config(compose(tiny(tiny_model_dir, tiny_task_dir))).splitlines()
    assert any(line.split()[2:4] == ["samples_per_step", "256"] for line in report)
    assert any(line.split()[2:4] == ["mini_batches_per_step", "1"] for line in report)
    assert any(line.startswith("memory plan: actor update") and line.endswith("fits") for line in report)
    assert not any(line.startswith("WARNING") for line in report)
    # A tiny model's parts under 10 MiB share one line per phase (they were ~25 lines of 0.00); rlcore-plan lists them.
    assert not any(line.split()[2:3] == ["0.00"] and "parts of under" not in line for line in report), report
    assert sum("parts of under 0.01 GiB each (rlcore-plan lists them)" in line for line in report) == 3, report


def test_an_oom_estimate_warns_before_ray_starts(tiny_model_dir, tiny_task_dir):
    report = check_config(compose(tiny(tiny_model_dir, tiny_task_dir, "trainer.device_memory_gb=0.1")))
    assert "WARNING rlcore: actor update is estimated at" in report and "more than 0.1 GiB" in report


def test_lengths_beyond_the_models_positions_are_a_config_error(tiny_model_dir, tmp_path):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 10
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="= 13 exceeds actor_rollout_ref.model.path's max_position_embeddings 10"):
        check_config(compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={model}"]))


def test_a_missing_critic_model_is_reported_before_ray_starts(tmp_path):
    cfg = compose(["recipe=tiny_cpu_ppo", f"critic.model.path={tmp_path}/no_model"])
    with pytest.raises(ConfigError, match=r"critic.model.path=.*no_model: no such directory; point critic.model.path at"):
        check_config(cfg)


@pytest.mark.parametrize("edit, strategy, message", [
    ({"model_type": "qwen3_5_text", "layer_types": ["linear_attention", "full_attention"]}, "fsdp",
     "recurrent state the native engine's KV pool cannot hold; use actor_rollout_ref.rollout.name=vllm"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "mlp_only_layers": [0]}, "fsdp", "set mlp_only_layers=[] and decoder_sparse_step=1"),
    ({"model_type": "my_lab_model"}, "fsdp", "model_type='my_lab_model' is not a causal LM transformers ships"),
    ({"use_sliding_window": True}, "megatron", "use_sliding_window=false in config.json"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "megatron", "has no megatron-core equivalent"),
])
def test_a_family_rlcore_cannot_run_is_refused_before_ray_starts(tiny_model_dir, tmp_path, edit, strategy, message):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **edit}))
    config_name = "ppo_megatron_trainer" if strategy == "megatron" else "ppo_trainer"
    with pytest.raises(ConfigError) as err:
        check_config(compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={model}"], config_name=config_name))
    assert f"actor_rollout_ref.model.path={model}: " in str(err.value) and message in str(err.value)


@pytest.mark.parametrize("overrides, pools, where", [
    ([], [(1, 2)], {"actor_rollout": 0}),
    (["reward.reward_model.enable=True"], [(1, 2)], {"actor_rollout": 0, "reward_model": 0}),
    # colocated with the critic by default (OpenRLHF's --colocate_critic_reward), wherever the critic is
    (["reward.reward_model.enable=True", "algorithm.adv_estimator=gae", "critic.enable_resource_pool=True", "critic.nnodes=1",
      "critic.n_gpus_per_node=1"], [(1, 2), (1, 1)], {"actor_rollout": 0, "critic": 1, "reward_model": 1}),
    (["reward.reward_model.enable=True", "reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1",
      "reward.reward_model.n_gpus_per_node=1", "algorithm.adv_estimator=gae"], [(1, 2), (1, 1)], {"actor_rollout": 0, "critic": 0, "reward_model": 1}),
    # the critic's own pool spans critic.nnodes x critic.n_gpus_per_node
    (["algorithm.adv_estimator=gae", "critic.enable_resource_pool=True", "critic.nnodes=2", "critic.n_gpus_per_node=1"],
     [(1, 2), (2, 1)], {"actor_rollout": 0, "critic": 1}),
    # split pools: the rollout's own pool spans rollout.nnodes x rollout.n_gpus_per_node
    (["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=2", "rollout.n_gpus_per_node=1"],
     [(1, 2), (2, 1)], {"actor_rollout": 0, "rollout": 1}),
])
def test_worker_group_placement(overrides, pools, where):
    from rlcore.plan.placement import placement

    assert placement(compose(["recipe=tiny_cpu", *overrides])) == (pools, where)
