"""How a role's verl keys become micro-batches: samples per rank, or a token budget per device that Ulysses scales."""

from types import SimpleNamespace

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
