"""rlcore/plan/micro_plan.py: each pass's micro-batches per rank, resolved once from verl's keys over the data-parallel
ranks of the group that runs it (the workers only add their engine's packing and Ulysses size)."""

import pytest

from rlcore.config import compose
from rlcore.config.validate import diagnose
from rlcore.plan.micro_plan import ACTOR_LOG_PROB, ACTOR_UPDATE, CRITIC_UPDATE, CRITIC_VALUES, REF_LOG_PROB, REWARD_MODEL, TEACHER, MicroBatch, micro_batches
from rlcore.plan.placement import placement
from rlcore.plan.run_plan import plan_run

D = "distillation"
EVERY_ROLE = ["recipe=tiny_cpu", "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
              "actor_rollout_ref.actor.use_kl_loss=True", "critic.enable=True", "reward.reward_model.enable=True",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "critic.ppo_micro_batch_size_per_gpu=16",
              "reward.reward_model.model_path=/rm", f"{D}.enabled=True", f"{D}.teacher_models.teacher_model.model_path=/t"]
TEACHER_MODEL = TEACHER.format(name="teacher_model")
# one of each: a critic by rows and by tokens, a reward model, Megatron, a vision policy with its reference, teachers
RECIPES = ["tiny_cpu_ppo", "gemma2_2b_ppo", "llama3_8b_rm_lora", "qwen2_32b_grpo_megatron", "qwen2_5_vl_7b_grpo", "qwen3_8b_opd_qwen3_32b"]


def micro(*overrides: str) -> dict[str, MicroBatch]:
    plan, errors = plan_run(compose([*EVERY_ROLE, *overrides]))
    assert plan.batch is not None, errors
    return plan.micro


def test_every_pass_of_the_run_is_planned_and_only_those():
    assert set(micro()) == {ACTOR_UPDATE, ACTOR_LOG_PROB, REF_LOG_PROB, CRITIC_UPDATE, CRITIC_VALUES, REWARD_MODEL, TEACHER_MODEL}
    no_kl = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=False"])
    # GRPO without KL: no critic, reward model or teacher; the reference's pass is the actor group's, planned always
    assert set(plan_run(no_kl)[0].micro) == {ACTOR_UPDATE, ACTOR_LOG_PROB, REF_LOG_PROB}


# verl's deprecated global sizes count samples over all the group's ranks: the plan divides by its data-parallel
# ranks (4 devices, Ulysses 2 for the actor's engine: 2), by the group that runs the pass.
DEPRECATED = [("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", REF_LOG_PROB, 2),
              ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", ACTOR_LOG_PROB, 2),
              ("critic", "forward_micro_batch_size", "use_dynamic_bsz", CRITIC_VALUES, 4),
              ("reward_model", "micro_batch_size", "use_dynamic_bsz", REWARD_MODEL, 4)]


@pytest.mark.parametrize("section, base, dynamic, name, dp", DEPRECATED)
def test_deprecated_global_micro_batch_keys_set_the_per_rank_size(section, base, dynamic, name, dp):
    sp = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=True"]
    planned = micro(*sp, f"{section}.{base}=32", f"{section}.{base}_per_gpu=null", f"{section}.{dynamic}=False")
    assert planned[name] == MicroBatch(rows=32 // dp)


def test_a_teacher_takes_the_references_sizes_unless_its_own():
    ref = "actor_rollout_ref.ref"
    assert micro(f"{ref}.log_prob_micro_batch_size_per_gpu=null", f"{ref}.log_prob_micro_batch_size=16")[TEACHER_MODEL] == MicroBatch(rows=4)
    own = f"{D}.teacher_models.teacher_model.inference"
    assert micro(f"+{own}.log_prob_micro_batch_size_per_gpu=3")[TEACHER_MODEL] == MicroBatch(rows=3)
    budget = micro(f"+{own}.log_prob_use_dynamic_bsz=True", f"+{own}.log_prob_max_token_len_per_gpu=2048")[TEACHER_MODEL]
    assert budget == MicroBatch(max_tokens=2048)


def test_token_budgets_per_device_and_the_critics_own_pool():
    planned = micro("actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000",
                    "critic.use_dynamic_bsz=True", "critic.forward_max_token_len_per_gpu=5000")
    assert planned[ACTOR_UPDATE] == MicroBatch(max_tokens=3000) and planned[CRITIC_VALUES] == MicroBatch(max_tokens=5000)
    assert planned[ACTOR_LOG_PROB] == MicroBatch(max_tokens=3000)  # verl: the rollout's budget follows the actor's
    # The critic on 2 devices of its own: its global size over its 2 ranks, not the actor's 4
    own_pool = micro("critic.enable_resource_pool=True", "critic.nnodes=1", "critic.n_gpus_per_node=2",
                     "critic.forward_micro_batch_size=32", "critic.forward_micro_batch_size_per_gpu=null")
    assert own_pool[CRITIC_VALUES] == MicroBatch(rows=16)


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_plan_and_the_validators_batch_plan_agree(recipe):
    # Two readers of the same keys: the validator's batch plan checks the sizes, this module hands them to the
    # workers. They must say the same for every recipe (FSDP2 and Megatron, Ulysses, critics, token budgets).
    cfg = compose([f"recipe={recipe}"])
    batch, errors = diagnose(cfg)
    assert batch is not None, errors
    planned = micro_batches(cfg, *placement(cfg))
    dynamic = cfg.actor_rollout_ref.actor.use_dynamic_bsz
    assert planned[ACTOR_UPDATE] == (MicroBatch(max_tokens=batch.ppo_max_token_len_per_rank) if dynamic else
                                     MicroBatch(rows=batch.ppo_micro_batch_size_per_rank))
    if not cfg.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz:
        assert planned[ACTOR_LOG_PROB] == MicroBatch(rows=batch.log_prob_micro_batch_size_per_rank)
    assert (CRITIC_UPDATE in planned) == batch.use_critic
    if batch.use_reference_policy and not cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz:
        assert planned[REF_LOG_PROB] == MicroBatch(rows=batch.ref_log_prob_micro_batch_size_per_rank)
    if batch.use_critic and not cfg.critic.use_dynamic_bsz:
        assert planned[CRITIC_UPDATE] == MicroBatch(rows=batch.critic_micro_batch_size_per_rank)
