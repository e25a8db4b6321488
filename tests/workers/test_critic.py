"""The critic: value model loading (from an LM or a reward model), values, and an exact, learning value update."""

import pytest
import torch
from dist_utils import assert_split_invariant, free_port, init_gloo, make_rollout_batch, split_rows
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, Qwen2ForSequenceClassification

from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.hf import load_config, load_value_model
from rlcore.protocol import DataProto
from rlcore.workers.common import mini_batch_counts
from rlcore.workers.critic import compute_values, make_value_loss_fn, update_value

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)

CRITIC = {"cliprange_value": 0.5, "ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4, "ppo_epochs": 1, "shuffle": False,
          "loss_scale_factor": None}


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A tiny HF reward model (Qwen2ForSequenceClassification, one label) with a non-trivial head."""
    config = load_config(tiny_model_dir)
    config.num_labels = 1
    torch.manual_seed(5)
    rm = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    path = str(tmp_path_factory.mktemp("tiny_rm"))
    rm.save_pretrained(path)
    return path


def test_value_model_from_a_reward_model_loads_trunk_and_head(reward_model_dir):
    rm = Qwen2ForSequenceClassification.from_pretrained(reward_model_dir).eval()
    critic = load_value_model(reward_model_dir).eval()
    torch.testing.assert_close(critic.score.weight, rm.score.weight)
    ids = torch.randint(6, rm.config.vocab_size, (3, 7))
    with torch.no_grad():
        # The RM scores a sequence at its last token: the critic's value there is that score exactly.
        torch.testing.assert_close(critic(input_ids=ids).logits[:, -1, 0], rm(input_ids=ids).logits[:, 0], atol=1e-5, rtol=1e-5)


def test_value_model_from_a_causal_lm_keeps_the_trunk(tiny_model_dir):
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    critic = load_value_model(tiny_model_dir)
    lm_trunk = dict(lm.model.named_parameters())
    for name, param in critic.model.named_parameters():
        torch.testing.assert_close(param, lm_trunk[name])
    assert critic.score.weight.shape == (1, lm.config.hidden_size) and critic.score.bias is None
    assert critic.config.classifier_dropout == 0.0  # no dropout noise on regression targets


@pytest.fixture
def engine(tiny_model_dir):
    init_gloo(0, 1, free_port())  # FSDP2 needs a process group; torn down by conftest
    return FSDP2Engine(EngineSpec(model_path=tiny_model_dir, kind="value", lr=1e-2), torch.device("cpu"))


def value_batch(engine, seed):
    data = DataProto.from_dict(make_rollout_batch(8, 6, 5, engine.hf_config.vocab_size, seed=seed))
    data.batch["values"] = compute_values(engine, data, MicroBatchSpec(rows=3)).batch["values"]
    g = torch.Generator().manual_seed(seed)
    data.batch["returns"] = torch.randn(8, 5, generator=g) * data.batch["response_mask"]
    return data


def test_values_are_masked_and_micro_batch_independent(engine):
    data = value_batch(engine, seed=1)
    torch.testing.assert_close(compute_values(engine, data, MicroBatchSpec(rows=8)).batch["values"], data.batch["values"], atol=1e-6, rtol=0)
    assert (data.batch["values"][data.batch["response_mask"] == 0] == 0).all()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_gradients_do_not_depend_on_micro_batch_splits(engine, mode):
    data = value_batch(engine, seed=2)
    cfg = OmegaConf.create({**CRITIC, "loss_agg_mode": mode})
    loss_fn = make_value_loss_fn(cfg, mini_batch_counts(data.batch["response_mask"], engine), 1)
    sets = [split_rows(data, sizes) for sizes in ([8], [2, 2, 2, 2], [1, 3, 4])]
    assert_split_invariant(engine, sets, loss_fn, "critic/vf_loss")


def test_update_value_fits_the_returns(engine):
    data = value_batch(engine, seed=3)
    cfg = OmegaConf.create({**CRITIC, "loss_agg_mode": "token-mean", "ppo_mini_batch_size": 4})
    first = update_value(engine, data, cfg, MicroBatchSpec(rows=4), rollout_n=2)
    for _ in range(30):  # PPO-style: each round clips around the values of the previous round
        data.batch["values"] = compute_values(engine, data, MicroBatchSpec(rows=8)).batch["values"]
        last = update_value(engine, data, cfg, MicroBatchSpec(rows=4), rollout_n=2)
    assert engine.optimizer_steps == 31  # one mini-batch (4 prompts x n=2 = 8 rows) per round
    assert last["critic/vf_loss"] < 0.5 * first["critic/vf_loss"]
    assert {"critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"} <= set(last)

