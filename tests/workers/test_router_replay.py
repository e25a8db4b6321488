"""Router replay through the hybrid worker (FSDP2 + the native rollout) on the tiny Qwen3-MoE (and R3 on DeepSeek-V3's
sigmoid router after a dense first layer, and GPT-OSS's top-k softmax router): R3's routes recorded by
the rollout in its prefill and decode steps are the routes the training forward takes on the same weights, and are
forced in the old-log-prob, reference and update forwards after the router moved; R2 records them in the
old-log-prob pass (padded micro-batches of a token budget too) and replays them in the update. The update reports
its routers' load, and HF's load-balancing loss joins the loss when the model's config asks for it."""

import numpy as np
import pytest
import torch
from dist_utils import free_port, init_gloo
from grpo_step import family_cfg, grpo_batch, prompts_batch

from rlcore.config import ConfigError
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.random_init import build_model_dir
from rlcore.models.router import ROUTES
from rlcore.protocol import DataProto
from rlcore.train import check_config
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

pytestmark = pytest.mark.numerics  # compares floats across kernels: re-run under other CPU kernels (make test-numerics)
R3 = ("actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_model_dir(str(tmp_path_factory.mktemp("moe") / "tiny-qwen3-moe"), "tiny-qwen3-moe", build_char_tokenizer())


def worker_for(moe_dir, task_dir, out_dir, *overrides, init: bool = True) -> ActorRolloutRefWorker:
    if init:
        init_gloo(0, 1, free_port())
    worker = ActorRolloutRefWorker(family_cfg(moe_dir, task_dir, out_dir, "actor_rollout_ref.actor.use_kl_loss=True", *overrides), 0, 1, "cpu")
    worker.init_model(total_steps=3)
    return worker


def prompt_and_response_routes(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(routes, where they decide a log-prob): every real token but each row's last, whose state predicts nothing."""
    mask = batch.batch["attention_mask"].bool().clone()
    last = mask.shape[1] - 1 - mask.flip(-1).int().argmax(-1)
    mask[torch.arange(len(mask)), last] = False
    return batch.batch[ROUTES], mask


@pytest.mark.parametrize("family, rollout", [("tiny-qwen3-moe", "native"), pytest.param("tiny-qwen3-moe", "vllm", marks=pytest.mark.vllm),
                                             ("tiny-deepseek-v3", "native"), ("tiny-gpt-oss", "native")])
def test_r3_records_the_rollouts_routes_and_every_training_forward_replays_them(family, moe_dir, tiny_task_dir, tmp_path, rollout):
    """native: hooks on HF's routers in its prefill and decode steps; vllm: callbacks on vLLM's routers
    (rlcore.rollout.vllm_routes; `make test-vllm` runs it in vLLM's venv). DeepSeek-V3's first layer is dense: its
    routes have one MoE layer."""
    model_dir = moe_dir if family == "tiny-qwen3-moe" else build_model_dir(str(tmp_path / family), family, build_char_tokenizer())
    worker = worker_for(model_dir, tiny_task_dir, tmp_path, *R3, f"actor_rollout_ref.rollout.name={rollout}")
    sampled = worker.generate_sequences(prompts_batch(worker.actor.hf_config.vocab_size))
    routes, decides = prompt_and_response_routes(sampled)
    moe_layers = 1 if family == "tiny-deepseek-v3" else 2
    assert routes.dtype == torch.int16 and routes.shape[2:] == (moe_layers, 2) and routes.shape[:2] == sampled.batch["input_ids"].shape
    # The training forward, free, routes as the rollout did (same weights, fp32): prefill and decode steps recorded right.
    free = worker.actor.forward([sampled], lambda out, mb: {ROUTES: out[ROUTES]}, _record())[0][ROUTES]
    assert torch.equal(free[decides], routes[decides])

    batch = grpo_batch(sampled, worker)  # old and reference log-probs replay the rollout's routes
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(batch.batch["old_log_probs"][mask], batch.batch["rollout_log_probs"][mask], atol=1e-5, rtol=1e-5)
    metrics = worker.update_actor(batch)
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    assert 1.0 <= metrics["actor/moe/load_max_over_mean"] <= 8 and 0 < metrics["actor/moe/router_entropy"] < np.log(8)
    assert {f"actor/moe/load_max_over_mean/layer_{i}" for i in range(moe_layers)} <= metrics.keys()

    # After the update the router moved: free, some tokens now take other experts; replayed, every one takes its old ones.
    moved = worker.actor.forward([sampled], lambda out, mb: {ROUTES: out[ROUTES]}, _record())[0][ROUTES]
    replayed = worker.actor.forward([batch], lambda out, mb: {ROUTES: out[ROUTES]}, _record(replay=True))[0][ROUTES]
    assert not torch.equal(moved[decides], routes[decides]), "lr 1e-2 should move some routes of the tiny model"
    assert torch.equal(replayed[decides], routes[decides])
    if rollout == "vllm":  # vLLM's shutdown destroys its groups, which must happen before the test's process group goes
        worker.rollout.llm.llm_engine.engine_core.shutdown()


def _record(replay: bool = False):
    """The routes a forward took (a replaying forward records too: what the experts received)."""
    from rlcore.engine.base import TokenRequest

    return TokenRequest(routes="replay" if replay else "record")


def test_r2_records_in_the_old_log_prob_pass_padded_and_by_token_budget_and_the_update_replays(moe_dir, tiny_task_dir, tmp_path):
    worker = worker_for(moe_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.actor.router_replay.mode=R2",
                        "actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
                        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40")
    sampled = worker.generate_sequences(prompts_batch(worker.actor.hf_config.vocab_size))
    assert ROUTES not in sampled.batch.keys()  # R2: the rollout records nothing
    old = worker.compute_log_prob(sampled)
    free = worker.actor.forward([sampled], lambda out, mb: {ROUTES: out[ROUTES]}, _record())[0][ROUTES]
    _, decides = prompt_and_response_routes(sampled.union(old))
    assert torch.equal(old.batch[ROUTES][decides], free[decides])  # micro-batches of 40 tokens, trimmed, put back in place
    batch = grpo_batch(sampled, worker)
    assert ROUTES in batch.batch.keys()
    metrics = worker.update_actor(batch)
    assert np.isfinite(metrics["actor/pg_loss"]) and "actor/moe/router_entropy" in metrics


def test_hfs_load_balancing_loss_joins_the_update_when_the_config_asks(moe_dir, tiny_task_dir, tmp_path):
    on = worker_for(moe_dir, tiny_task_dir, tmp_path / "on", "+actor_rollout_ref.model.override_config.output_router_logits=True",
                    "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.5")
    off = worker_for(moe_dir, tiny_task_dir, tmp_path / "off", init=False)
    prompts = prompts_batch(on.actor.hf_config.vocab_size)
    batch = grpo_batch(on.generate_sequences(prompts), on)
    with_aux, without = on.update_actor(batch), off.update_actor(batch)
    # 0.5 x HF's loss, which is top_k (2) when balanced and more otherwise
    assert 2 * 0.5 <= with_aux["actor/moe/aux_loss"] <= 8 * 0.5 and "actor/moe/aux_loss" not in without
    assert with_aux["actor/grad_norm"] != pytest.approx(without["actor/grad_norm"], rel=1e-4)


def test_a_checkpointed_layer_replays_the_same_routes_in_its_recompute(moe_dir, tiny_task_dir, tmp_path):
    """With activation checkpointing each layer runs again in backward: the replayed routes must hold there too, so an
    R3 update after the router moved is the same update with checkpointing on and off (and the load is counted once)."""
    workers = [worker_for(moe_dir, tiny_task_dir, tmp_path / str(ckpt), *R3, f"actor_rollout_ref.model.enable_gradient_checkpointing={ckpt}",
                          init=ckpt) for ckpt in (True, False)]
    batch = grpo_batch(workers[0].generate_sequences(prompts_batch(workers[0].actor.hf_config.vocab_size)), workers[0])
    for worker in workers:  # the router moves first: replayed and free routes now differ
        worker.update_actor(batch)
    second = [worker.update_actor(batch) for worker in workers]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/moe/load_max_over_mean", "actor/moe/router_entropy"):
        assert second[0][key] == pytest.approx(second[1][key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.actor.router_replay.mode=R3"], "set it, or use mode=R2"),
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=True"], "records routes that only"),
    (["actor_rollout_ref.actor.router_replay.mode=R4"], "is not one of disabled, R2, R3"),
    (["actor_rollout_ref.actor.router_replay.record_file=/tmp/x"], "verl declares it and never reads it"),
    (["actor_rollout_ref.ref.router_replay.mode=R2"], "the reference replays the actor's routes"),
])
def test_router_replay_keys_are_checked_before_ray_starts(overrides, message, tiny_model_dir, tiny_task_dir, tmp_path):
    from e2e_utils import tiny_cfg

    with pytest.raises(ConfigError, match=message):
        check_config(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *overrides))


@pytest.mark.parametrize("overrides", [
    ("actor_rollout_ref.actor.router_replay.mode=R2", "actor_rollout_ref.actor.strategy=megatron",
     "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", "actor_rollout_ref.model.enable_gradient_checkpointing=True"),
    (*R3, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"),
])
def test_replay_runs_over_pipeline_stages_recomputation_and_ulysses(overrides, tiny_model_dir, tiny_task_dir, tmp_path):
    """Both were refused before; tests/engine/test_megatron_moe.py and test_fsdp2_ulysses.py run them."""
    from e2e_utils import tiny_cfg

    check_config(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *overrides))


def test_replay_on_a_dense_model_names_the_key(tiny_model_dir, tiny_task_dir, tmp_path):
    worker = worker_for(tiny_model_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.actor.router_replay.mode=R2")
    with pytest.raises(ValueError, match="router_replay.mode=disabled"):
        worker.compute_log_prob(worker.generate_sequences(prompts_batch(worker.actor.hf_config.vocab_size)))

