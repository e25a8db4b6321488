"""How a role's verl keys become micro-batches: samples per rank, or a token budget per device that Ulysses scales."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlcore.engine.base import EngineSpec
from rlcore.workers.common import micro_batch_spec

SECTION = OmegaConf.create({"ppo_micro_batch_size": 64, "ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": False,
                            "ppo_max_token_len_per_gpu": 4096})


def _engine(sp: int = 1, dp: int = 4, packed: bool = True):
    return SimpleNamespace(spec=EngineSpec(model_path="m", use_remove_padding=packed, ulysses_sp=sp), dp_size=dp)


def _spec(engine, **changes):
    section = OmegaConf.merge(SECTION, changes)
    return micro_batch_spec(section, "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu", engine)


def test_rows_per_rank_from_either_key():
    assert _spec(_engine()).rows == 16  # the deprecated global size over 4 data-parallel ranks
    assert _spec(_engine(), ppo_micro_batch_size_per_gpu=8).rows == 8
    # Ulysses: an sp group is one data-parallel rank, and its micro-batch is the per-gpu size (each rank a slice)
    assert _spec(_engine(sp=2, dp=2), ppo_micro_batch_size_per_gpu=8).rows == 8


def test_a_token_budget_per_device_times_the_ulysses_size():
    assert _spec(_engine(), use_dynamic_bsz=True).max_tokens == 4096
    spec = _spec(_engine(sp=4, dp=1), use_dynamic_bsz=True)
    assert spec.max_tokens == 4 * 4096 and spec.packed  # verl: max_token_len x sp per micro-batch, 4096 per rank


# Each worker's pass and the section it reads (rlcore/workers/actor_rollout_ref.py::_micro_batches, critic.py::
# compute_values, reward_model.py::compute_rm_score): verl's deprecated global micro-batch keys, split over the ranks.
DEPRECATED = [("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"),
              ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"),
              ("critic", "forward_micro_batch_size", "use_dynamic_bsz", "forward_max_token_len_per_gpu"),
              ("reward_model", "micro_batch_size", "use_dynamic_bsz", "forward_max_token_len_per_gpu")]


@pytest.mark.parametrize("section, base, dynamic, budget", DEPRECATED)
def test_deprecated_global_micro_batch_keys_set_the_per_rank_size(section, base, dynamic, budget):
    from rlcore.config import compose

    cfg = compose(["recipe=tiny_cpu", f"{section}.{base}=32", f"{section}.{base}_per_gpu=null", f"{section}.{dynamic}=False"])
    assert micro_batch_spec(OmegaConf.select(cfg, section), base, dynamic, budget, _engine(dp=4)).rows == 8  # 32 over 4 ranks
    cfg = compose(["recipe=tiny_cpu", f"{section}.{base}=8", f"{section}.{base}_per_gpu=null", f"{section}.{dynamic}=False"])
    assert micro_batch_spec(OmegaConf.select(cfg, section), base, dynamic, budget, _engine(dp=4)).rows == 2


def test_a_role_holds_the_run_config_as_the_schemas_objects():
    """What the controller sends (the typed config) is kept as is; a dict of the composed config (as tests build
    workers) becomes the same objects, the schema's defaults under what it leaves out."""
    from rlcore.config import compose
    from rlcore.config.schema import PPOConfig
    from rlcore.config.sft_schema import SFTTrainerConfig
    from rlcore.config.typed import typed
    from rlcore.train_sft import compose_sft
    from rlcore.workers.common import RoleWorker
    from rlcore.workers.sft_trainer import SFTTrainerWorker

    run = typed(compose(["recipe=tiny_cpu"]), PPOConfig)
    assert RoleWorker(run).config is run
    held = RoleWorker({"actor_rollout_ref": {"actor": {"ppo_epochs": 3}}}).config
    assert isinstance(held, PPOConfig) and held.actor_rollout_ref.actor.ppo_epochs == 3
    assert held.actor_rollout_ref.rollout.n == PPOConfig().actor_rollout_ref.rollout.n
    assert isinstance(SFTTrainerWorker(OmegaConf.to_container(compose_sft([]), resolve=True)).config, SFTTrainerConfig)
