"""The prefix grouper (rlcore/models/prefix_grouper.py, verl's actor.use_prefix_grouper): rows that share a prompt
are packed with that prompt once, and the FSDP2 engine's log-probs, entropies and gradients equal those of the rows
packed one by one; the config rules refuse what it cannot run with."""

import pytest
import torch
from dist_utils import free_port, init_gloo, make_rollout_batch, position_ids_from_mask

from rlcore.config import compose
from rlcore.config.validate import ConfigError, validate_config
from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec, FSDPSpec
from rlcore.engine.fsdp2 import FSDP2Engine
from rlcore.models.prefix_grouper import pack_prefix_groups
from rlcore.protocol import DataProto
from rlcore.workers.actor import compute_log_prob

PROMPT, RESPONSE = 7, 9
PG = "actor_rollout_ref.actor.use_prefix_grouper=True"


def grouped_batch(groups=(3, 1, 4), seed=11) -> dict:
    """GRPO's layout: each prompt repeated for its group's rows (uneven responses), groups of 3, 1 and 4 rows."""
    b = make_rollout_batch(sum(groups), PROMPT, RESPONSE, 60, seed=seed)
    start = 0
    for size in groups:
        for key in ("input_ids", "attention_mask"):
            b[key][start:start + size, :PROMPT] = b[key][start, :PROMPT].clone()
        start += size
    b["position_ids"] = position_ids_from_mask(b["attention_mask"])
    return b


def test_each_distinct_prompt_is_packed_once_and_each_response_reads_it():
    b = grouped_batch()
    packed, saved = pack_prefix_groups(b["input_ids"], b["attention_mask"], b["position_ids"], RESPONSE)
    prompt_lens = b["attention_mask"][:, :PROMPT].sum(-1)
    response_lens = b["attention_mask"][:, PROMPT:].sum(-1)
    assert packed.input_ids.shape[1] == int(prompt_lens[[0, 3, 4]].sum() + response_lens.sum())  # 3 prompts, 8 responses
    assert saved == int(prompt_lens.sum() - prompt_lens[[0, 3, 4]].sum())
    groups = packed.attention_kwargs["rlcore_prefix_groups"]
    assert groups.bounds.tolist()[0] == 0 and len(groups.bounds) == 4
    # the state before each row's first response token is its group's last prompt token: rows 0-2 share it
    first = packed.response_index.split(response_lens.tolist())
    assert first[0][0] == first[1][0] == first[2][0] != first[3][0]
    assert packed.input_ids[0, first[0][0]] == b["input_ids"][0, PROMPT - 1]
    assert packed.input_ids[0, first[1][1]] == b["responses"][1, 0]  # then the row's own previous token
    torch.testing.assert_close(packed.position_ids[0, first[1][1]], b["position_ids"][1, PROMPT])


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    init_gloo(0, 1, free_port())  # torn down by conftest
    out = []
    for grouped in (False, True):
        spec = EngineSpec(model_path=tiny_model_dir, use_remove_padding=True, fsdp=FSDPSpec(prefix_grouper=grouped), lr=1e-3)
        out.append(FSDP2Engine(spec, torch.device("cpu")))
    return out


def nll(outputs, mb):
    mask = mb.batch["response_mask"]
    return -(outputs["log_probs"] * mask).sum() / mask.sum(), {}


def test_grouped_log_probs_entropy_and_gradients_equal_the_rows_packed_one_by_one(engines):
    from rlcore.engine.factory import engine_spec

    cfg = compose(["recipe=tiny_cpu", PG]).actor_rollout_ref
    assert engine_spec("fsdp2", cfg.model, cfg.actor, cfg.actor.optim, 1.0, 10).fsdp.prefix_grouper  # actor.use_prefix_grouper
    data = DataProto.from_dict(grouped_batch())
    packed, grouped = engines
    mask = data.batch["response_mask"].bool()
    # micro-batches of 3 rows: the group of 4 is split over two of them, and still equal
    a, b = (compute_log_prob(e, data, MicroBatchSpec(rows=3, packed=True), temperature=0.7, with_entropy=True) for e in engines)
    for key in ("log_probs", "entropys"):
        torch.testing.assert_close(b.batch[key][mask], a.batch[key][mask], atol=1e-5, rtol=1e-5)
    grads = []
    for engine in engines:
        engine.forward_backward([data], nll)
        grads.append([p.grad.full_tensor().clone() for p in engine.model.parameters()])
        engine.optimizer.zero_grad(set_to_none=True)
    for g_grouped, g_packed in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_grouped, g_packed, atol=1e-5, rtol=1e-4)


def test_the_config_refuses_what_the_prefix_grouper_cannot_run_with():
    assert validate_config(compose(["recipe=tiny_cpu", PG, "actor_rollout_ref.model.use_remove_padding=False"]))  # verl's script
    with pytest.raises(ConfigError) as refused:
        validate_config(compose(["recipe=tiny_cpu", PG, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                 "actor_rollout_ref.actor.router_replay.mode=R2"]))
    assert any("use_prefix_grouper=True with Ulysses sequence parallelism (size 2)" in m for m in refused.value.messages)
    assert any("use_prefix_grouper=True with router replay" in m for m in refused.value.messages)
