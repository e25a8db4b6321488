"""Attention heads against rollout TP (vLLM), Megatron TP and Ulysses SP, named before any engine is built."""

from rlcore.config import compose
from rlcore.plan.arch import builtin_arch
from rlcore.plan.heads import head_errors, policy_heads

QWEN7B = builtin_arch("qwen2.5-7b")  # 28 heads, 4 KV heads


def test_vllm_splits_query_heads_and_splits_or_replicates_kv_heads():
    for tp, ok in ((1, True), (2, True), (4, True), (7, False), (8, False)):
        cfg = compose(["recipe=qwen2_7b_grpo", f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"])
        assert (head_errors(cfg, QWEN7B, "actor_rollout_ref.model.path") == []) == ok, tp
    llama70 = builtin_arch("llama3-70b")  # 64 heads, 8 KV heads: TP 16 replicates each KV head twice
    cfg = compose(["recipe=llama_70b_multinode", "trainer.n_gpus_per_node=16", "actor_rollout_ref.rollout.tensor_model_parallel_size=16"])
    assert head_errors(cfg, llama70, "m") == []
    cfg = compose(["recipe=llama_70b_multinode", "actor_rollout_ref.rollout.tensor_model_parallel_size=3"])
    assert ("use actor_rollout_ref.rollout.tensor_model_parallel_size=2 or actor_rollout_ref.rollout.tensor_model_parallel_size=4"
            in head_errors(cfg, llama70, "m")[0])


def test_megatron_needs_both_head_counts_divisible_and_the_fix_fits_the_node():
    cfg = compose(["recipe=qwen2_7b_grpo", "actor_rollout_ref.actor.strategy=megatron",
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    [error] = [e for e in head_errors(cfg, QWEN7B, "m") if "megatron" in e]  # once: not again for the reference
    assert error.startswith("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8 does not split")
    assert error.endswith("use actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4")


def test_a_reference_tp_the_user_set_is_reported_against_its_own_key():
    """The reference follows the actor's TP unless set: reported against the reference's key only when the user
    wrote it (the doctor once blamed actor_rollout_ref.ref.megatron... for a value set on the actor alone)."""
    cfg = compose(["recipe=qwen2_7b_grpo", "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=8"])
    [error] = [e for e in head_errors(cfg, QWEN7B, "m") if "megatron" in e]
    assert error.startswith("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=8 does not split")


def test_ulysses_needs_the_query_heads_divisible_and_repeats_kv_heads():
    for key in ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"):
        cfg = compose(["recipe=qwen2_7b_grpo", f"{key}=8"])  # 28 heads do not split 8 ways
        [error] = head_errors(cfg, QWEN7B, "m")
        assert error.startswith(f"{key}=8 does not split") and error.endswith(f"use {key}=4"), error
    # 4 ways: 7 query heads per rank; the 4 KV heads split one each (8 ways they would be repeated)
    assert head_errors(compose(["recipe=qwen2_7b_grpo", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"]), QWEN7B, "m") == []


def test_the_policys_heads_come_from_its_config_or_the_table():
    assert policy_heads(compose(["recipe=qwen2_7b_grpo"])) == (28, 4)
    assert policy_heads(compose(["actor_rollout_ref.model.path=/models/unknown-model"])) is None
