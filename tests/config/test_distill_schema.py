"""distillation.*: verl's keys compose (teachers added with `+`, as its examples do), the teachers are read over their
defaults, and bad settings are refused with the key and a fix, all at once."""

from pathlib import Path

import pytest

from rlcore.config import ConfigError, compose, validate_config
from rlcore.config.distill_schema import teacher_entries, teacher_of_rows
from rlcore.plan.placement import placement

D = "distillation"
ON = ["recipe=tiny_cpu", f"{D}.enabled=True", f"{D}.teacher_models.teacher_model.model_path=/models/teacher"]


def errors(*overrides: str) -> list[str]:
    try:
        validate_config(compose(list(overrides)))
    except ConfigError as err:
        return err.messages
    return []


def test_a_single_teacher_reads_over_its_defaults_with_the_rollouts_engine_dtype_and_temperature():
    cfg = compose(ON + ["actor_rollout_ref.rollout.temperature=0.7"])
    assert errors(*ON) == []
    (name, teacher), = teacher_entries(cfg).items()
    assert name == "teacher_model" and teacher.model_path == "/models/teacher"
    assert (teacher.inference.name, teacher.inference.dtype, teacher.inference.temperature) == (
        cfg.actor_rollout_ref.rollout.name, cfg.actor_rollout_ref.rollout.dtype, 0.7)


def test_teachers_per_data_source_route_rows_by_their_key():
    cfg = compose(["recipe=tiny_cpu", f"{D}.enabled=True", f"+{D}.teacher_models.math.model_path=/m",
                   f"+{D}.teacher_models.math.key=gsm8k", f"+{D}.teacher_models.code.model_path=/c", f"+{D}.teacher_models.code.key=mbpp"])
    validate_config(cfg)
    teachers = teacher_entries(cfg)
    assert sorted(teachers) == ["code", "math"]
    assert teacher_of_rows(["mbpp", "gsm8k", "gsm8k"], teachers, "data_source") == ["code", "math", "math"]
    with pytest.raises(ValueError, match="data_source='aime' have no teacher"):
        teacher_of_rows(["aime"], teachers, "data_source")


def test_verls_loss_rules_and_every_problem_at_once():
    found = errors(*ON, f"{D}.distillation_loss.loss_mode=k1", f"{D}.distillation_loss.use_policy_gradient=False",
                   f"+{D}.teacher_models.other.model_path=/o", f"{D}.teacher_models.teacher_model.inference.name=sglang")
    assert len(found) == 3
    assert "gradient of k1 does not depend on the teacher" in found[0]
    assert "need a distinct distillation.teacher_models.<name>.key" in found[1]
    assert "inference.name=sglang is not one of native, vllm" in found[2]
    assert "is not one of k1" in errors(*ON, f"{D}.distillation_loss.loss_mode=reverse_kl")[0]
    megatron = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron"]
    assert any("does not yet gather" in e for e in errors(*ON, *megatron, f"{D}.distillation_loss.loss_mode=forward_kl_topk"))
    assert "stale" in errors(*ON, "actor_rollout_ref.hybrid_engine=False")[-1]


def test_a_misspelled_teacher_key_is_named_with_the_right_one():
    found = errors(*ON, f"+{D}.teacher_models.teacher_model.modle_path=/x")
    assert found == [f"{D}.teacher_models.teacher_model.modle_path is not a key of a teacher; did you mean "
                     f"{D}.teacher_models.teacher_model.model_path?"]


def test_no_teacher_and_verls_pool_arithmetic():
    assert "no teacher has a model_path" in errors("recipe=tiny_cpu", f"{D}.enabled=True")[0]
    pool = [f"{D}.n_gpus_per_node=2", f"{D}.nnodes=1", f"{D}.teacher_models.teacher_model.inference.name=vllm"]
    assert errors(*ON, *pool, f"{D}.teacher_models.teacher_model.num_replicas=2") == []
    assert "take 1 devices" in errors(*ON, *pool, f"{D}.teacher_models.teacher_model.num_replicas=1")[0]
    assert "needs both" in errors(*ON, f"{D}.n_gpus_per_node=2")[0]


def test_a_vllm_teacher_spans_a_tp_group_of_its_pool_or_of_the_actors_nodes():
    # verl's OPD scripts: a 32B teacher at TP2 on a pool of 4 (two replicas), a 35B MoE at TP8 x EP8 on a pool of 8
    t = f"{D}.teacher_models.teacher_model"
    pool = [f"{D}.n_gpus_per_node=4", f"{D}.nnodes=1", f"{t}.inference.name=vllm"]
    assert errors(*ON, *pool, f"{t}.inference.tensor_model_parallel_size=2") == []
    assert errors(*ON, *pool, f"{t}.inference.tensor_model_parallel_size=4", f"{t}.inference.expert_parallel_size=4") == []
    assert "expert_parallel_size=2 must be 1 or" in errors(*ON, *pool, f"{t}.inference.tensor_model_parallel_size=4",
                                                             f"{t}.inference.expert_parallel_size=2")[0]
    assert "straddle nodes of 4" in errors(*ON, *pool, f"{t}.inference.tensor_model_parallel_size=8")[0]
    assert "pipeline_model_parallel_size=2" in errors(*ON, *pool, f"{t}.inference.pipeline_model_parallel_size=2")[0]
    # sharing the actor's devices (tiny_cpu: 2 per node), a TP group must tile its nodes
    assert errors(*ON, f"{t}.inference.name=vllm", f"{t}.inference.tensor_model_parallel_size=2") == []
    assert "does not tile trainer.n_gpus_per_node=2" in errors(*ON, f"{t}.inference.name=vllm",
                                                               f"{t}.inference.tensor_model_parallel_size=4")[0]


def test_teachers_share_the_actors_pool_unless_given_their_own():
    assert placement(compose(ON))[1]["teacher"] == 0
    pools, where = placement(compose(ON + [f"{D}.n_gpus_per_node=1", f"{D}.nnodes=1"]))
    assert pools[where["teacher"]] == (1, 1) and where["teacher"] != where["actor_rollout"]


def test_a_top_k_loss_as_a_policy_gradient_reward_is_warned_as_verl_does(capsys, monkeypatch):
    from rlcore.cli.plan import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(["--elsewhere", *ON, f"{D}.distillation_loss.loss_mode=forward_kl_topk", f"{D}.distillation_loss.use_policy_gradient=True"]) == 0
    out = capsys.readouterr().out
    assert "warning: distillation.distillation_loss.loss_mode=forward_kl_topk with distillation.distillation_loss.use_policy_gradient=True" in out
    assert main(["--elsewhere", *ON, f"{D}.distillation_loss.loss_mode=forward_kl_topk"]) == 0  # verl 0.9's default: False
    assert "use_policy_gradient=True: the update" not in capsys.readouterr().out
