"""Which modules FSDP2 shards as units (fsdp_config.wrap_policy.min_num_params) and the order its all-gathers are
issued in (fsdp_config.forward_prefetch), on one gloo rank; the 2-rank equality with hybrid sharding is in
test_fsdp2.py."""

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.engine.base import EngineSpec, FSDPSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.engine.fsdp_units import fsdp_units
from rlcore.protocol import DataProto


def tied_model() -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def test_min_num_params_picks_modules_by_size_and_leaves_tied_weights_to_the_root():
    model = tied_model()
    blocks = model.model.layers
    assert fsdp_units(model, blocks, 0) == list(blocks)  # verl's FSDP2 default: one unit per decoder block
    # 3 x 64 x 128 = 24,576 parameters in each MLP, 12,480 in each attention: at 20,000 the MLPs are units, and
    # what is left of a block (attention + norms) is not.
    units = fsdp_units(model, blocks, 20_000)
    assert units == [block.mlp for block in blocks]
    # At 30,000 the blocks are units again (their 37,184 parameters), and the decoder stack, which holds the tied
    # embedding, never is: the LM head shares that weight, so both stay in the root unit.
    assert fsdp_units(model, blocks, 30_000) == list(blocks)
    assert fsdp_units(model, blocks, 10**9) == []


@pytest.fixture
def pg():
    init_gloo(0, 1, free_port())


def _gather_order(engine: FSDP2Engine, data: DataProto) -> list[tuple[str, int]]:
    """("gather", i) when block i's parameters are all-gathered, ("forward", i) when its forward starts."""
    events = []
    for i, block in enumerate(engine.model.model.layers):
        group = block._get_fsdp_state()._fsdp_param_group
        unshard = group.unshard
        group.unshard = lambda *a, i=i, unshard=unshard, **k: (events.append(("gather", i)), unshard(*a, **k))[1]
        block.register_forward_pre_hook(lambda *_, i=i: events.append(("forward", i)))
    engine.forward([data], lambda out, mb: {"lp": out["log_probs"]})
    return events


def test_forward_prefetch_gathers_the_next_block_before_the_current_one_runs(pg, tiny_model_dir):
    data = DataProto.from_dict(make_rollout_batch(4, 6, 5, 100, seed=1))
    plain = _gather_order(FSDP2Engine(EngineSpec(model_path=tiny_model_dir), torch.device("cpu")), data)
    assert plain.index(("gather", 1)) > plain.index(("forward", 0))  # gathered when its own forward starts
    engine = FSDP2Engine(EngineSpec(model_path=tiny_model_dir, fsdp=FSDPSpec(forward_prefetch=True)), torch.device("cpu"))
    prefetched = _gather_order(engine, data)
    assert prefetched.index(("gather", 1)) < prefetched.index(("forward", 0))  # issued as block 0 starts
