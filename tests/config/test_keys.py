"""Keys the schema does not have: `+key` typos inside typed sections are refused with the closest real key."""

from rlcore.config import compose
from rlcore.config.keys import closest_key, unknown_key_errors


def test_a_plus_key_next_to_a_schema_field_is_refused_with_did_you_mean():
    cfg = compose(["recipe=tiny_cpu", "+actor_rollout_ref.rollout.gpu_memory_utilisation=0.6", "+trainer.n_gpu_per_node=2"])
    assert unknown_key_errors(cfg) == [
        "actor_rollout_ref.rollout.gpu_memory_utilisation is not a config key (`+` adds a key, but this section's keys are fixed); "
        "did you mean actor_rollout_ref.rollout.gpu_memory_utilization?",
        "trainer.n_gpu_per_node is not a config key (`+` adds a key, but this section's keys are fixed); did you mean trainer.n_gpus_per_node?",
    ]


def test_free_form_sections_take_new_keys_and_every_recipe_is_clean():
    cfg = compose(["recipe=tiny_cpu", "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
                   "+reward.reward_kwargs.max_resp_len=5"])
    assert unknown_key_errors(cfg) == []
    for recipe in ("qwen2_7b_grpo", "qwen2_32b_grpo_megatron", "tiny_cpu_tools", "llama_70b_multinode"):
        assert unknown_key_errors(compose([f"recipe={recipe}"])) == []


def test_closest_key_prefers_the_section_then_the_name_elsewhere():
    cfg = compose(["recipe=tiny_cpu"])
    assert closest_key("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus", cfg) == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    assert closest_key("actor_rollout_ref.rollout.use_kl_loss", cfg) == "actor_rollout_ref.actor.use_kl_loss"  # wrong section
    assert closest_key("algorithm.kl_ctrl.kl_coeff", cfg) == "algorithm.kl_ctrl.kl_coef"
    assert closest_key("actor_rollout_ref.rolout.n", cfg) == "actor_rollout_ref.rollout.n"
    assert closest_key("trainer.frobnicate", cfg) is None
