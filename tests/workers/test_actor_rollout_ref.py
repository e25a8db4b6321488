"""The hybrid worker (rlcore/workers/actor_rollout_ref.py) as built from the run's config: what the rollout keys
change in it. Its GRPO step is tests/grpo_step.py's, shared with the model-family and router-replay tests."""

import copy
import os

import torch
from dist_utils import free_port, init_gloo
from grpo_step import family_cfg, prompts_batch

from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

ROLLOUT = "actor_rollout_ref.rollout"


def test_rollout_seed_decides_the_samples_and_full_determinism_switches_the_process(tiny_model_dir, tiny_task_dir, tmp_path,
                                                                                   monkeypatch):
    """verl's rollout.seed: the rollout engine's seed (it follows trainer.seed unless set: test_rollout_factory.py),
    which alone decides the samples; rollout.full_determinism: deterministic kernels in the worker's process, set
    before its engines are built (the colocated actor computes on them too). Two runs' bits: the resume tests of
    tests/e2e/test_tiny_grpo.py (native) and test_tiny_vllm.py (vLLM)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after: the switch sets it
    init_gloo(0, 1, free_port())

    config = family_cfg(tiny_model_dir, tiny_task_dir, tmp_path)  # composed once (Hydra's second a worker), resolved

    def samples(trainer_seed: int, rollout_seed: int, full_determinism: bool = False) -> torch.Tensor:
        cfg = copy.deepcopy(config)
        cfg["trainer"]["seed"] = trainer_seed
        cfg["actor_rollout_ref"]["rollout"].update(seed=rollout_seed, full_determinism=full_determinism)
        worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
        worker.init_model(total_steps=1)
        return worker.generate_sequences(prompts_batch(worker.actor.hf_config.vocab_size)).batch["responses"]

    assert not torch.are_deterministic_algorithms_enabled()
    try:
        seeded = samples(trainer_seed=1, rollout_seed=5, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.equal(samples(trainer_seed=9, rollout_seed=5), seeded)  # the rollout's seed alone decides
        assert not torch.equal(samples(trainer_seed=1, rollout_seed=6), seeded)  # another one samples anew
    finally:
        torch.use_deterministic_algorithms(False)


def test_each_roles_engine_full_determinism_switches_its_process(tiny_model_dir, tiny_task_dir, tmp_path):
    """verl 0.9's <role>.fsdp_config.full_determinism (the critic's critic.fsdp.full_determinism, the SFT and reward
    trainers' model.fsdp_config.full_determinism, which follows engine.full_determinism): deterministic kernels in the
    process of the role's engine, as the rollout's own key does (the colocated actor and reference share it)."""
    from rlcore.config import compose
    from rlcore.train_sft import compose_sft

    def hybrid(*overrides):
        return ActorRolloutRefWorker(family_cfg(tiny_model_dir, tiny_task_dir, tmp_path, *overrides), 0, 1, "cpu").full_determinism()

    assert not hybrid()
    assert hybrid("actor_rollout_ref.actor.fsdp_config.full_determinism=True")
    assert hybrid(f"{ROLLOUT}.full_determinism=True")
    assert hybrid("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.ref.fsdp_config.full_determinism=True")
    assert not hybrid("actor_rollout_ref.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=False",
                      "actor_rollout_ref.ref.fsdp_config.full_determinism=True")  # no reference built: nothing of its
    assert compose(["critic.fsdp.full_determinism=True"]).critic.fsdp.full_determinism  # read by CriticWorker.init_model
    assert compose_sft(["engine.full_determinism=True"]).model.fsdp_config.full_determinism  # what SFTTrainerWorker reads
