"""Token-budget micro-batches on 2 gloo ranks whose shares differ in length: the ranks agree on the number of
micro-batches (otherwise FSDP's collectives would hang) and the gradients equal a single-process full batch,
padded and packed."""

import pytest
import torch
from dist_utils import close_gloo, init_gloo, make_rollout_batch, spawn_ranks, token_outputs
from omegaconf import OmegaConf

from rlcore.config.actor_schema import ActorConfig
from rlcore.data.micro_batches import MicroBatchSpec, make_micro_batches, sequence_lengths
from rlcore.data.seqlen_balancing import budget_partitions
from rlcore.models.hf import load_causal_lm
from rlcore.protocol import DataProto, position_ids_from_mask
from rlcore.workers.actor import make_policy_loss_fn

pytestmark = pytest.mark.numerics  # compares floats across layouts/kernels: re-run under other CPU kernels (make test-numerics)

# the schema's actor section (every field the loss reads has its default), with these settings
ACTOR = OmegaConf.merge(OmegaConf.structured(ActorConfig), {
    "policy_loss": {"loss_mode": "vanilla"}, "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0, "entropy_coeff": 0.0, "use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.1,
})
ROWS, PROMPT, RESPONSE, BUDGET = 16, 6, 12, 40


def skewed_batch(vocab: int) -> DataProto:
    """Rows 0-7 (rank 0's share) have 1-2 response tokens, rows 8-15 (rank 1's) have 10-12."""
    b = make_rollout_batch(ROWS, PROMPT, RESPONSE, vocab, seed=12)
    lengths = [1, 2] * 4 + [10, 11, 12, 10, 11, 12, 12, 10]
    b["response_mask"] = (torch.arange(RESPONSE)[None] < torch.tensor(lengths)[:, None]).long()
    b["responses"] = b["responses"].clamp(min=6) * b["response_mask"]
    b["attention_mask"] = torch.cat([b["attention_mask"][:, :PROMPT], b["response_mask"]], -1)
    b["input_ids"] = torch.cat([b["input_ids"][:, :PROMPT], b["responses"]], -1)
    b["position_ids"] = position_ids_from_mask(b["attention_mask"])
    return DataProto.from_dict(b)


def loss_fn_for(data: DataProto, dp_size: int):
    mask = data.batch["response_mask"]
    return make_policy_loss_fn(ACTOR, (float(mask.sum()), float(ROWS)), dp_size)


def _rank_main(rank: int, port: int, model_dir: str, out_path: str) -> None:
    from rlcore.engine.base import EngineSpec
    from rlcore.engine.fsdp2 import FSDP2Engine

    init_gloo(rank, 2, port)
    result = {}
    for packed in (False, True):
        engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=packed), torch.device("cpu"))
        data = skewed_batch(engine.hf_config.vocab_size)
        shard = data.chunk(2)[rank]
        parts, _ = make_micro_batches(shard, MicroBatchSpec(max_tokens=BUDGET, packed=packed))
        engine.forward_backward(parts, loss_fn_for(data, 2))
        alone = len(budget_partitions(sequence_lengths(shard), BUDGET, packed))  # what this rank would need by itself
        counts = [torch.zeros(2, dtype=torch.long) for _ in range(2)]
        torch.distributed.all_gather(counts, torch.tensor([alone, len(parts)]))
        result[packed] = {"counts": [c.tolist() for c in counts], "grads": {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}}
    if rank == 0:
        torch.save(result, out_path)
    close_gloo()


@pytest.fixture(scope="module")
def two_rank_result(tiny_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dynamic_bsz") / "result.pt")
    spawn_ranks(_rank_main, 2, lambda port: (port, tiny_model_dir, out))
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("packed", [False, True])
def test_two_rank_token_budget_gradients_equal_single_process(two_rank_result, tiny_model_dir, packed):
    model = load_causal_lm(tiny_model_dir)
    data = skewed_batch(model.config.vocab_size)
    b = data.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    loss, _ = loss_fn_for(data, 1)(token_outputs(logits[:, -RESPONSE - 1 : -1], b["responses"]), data)
    loss.backward()
    # Rank 0's short rows need fewer 40-token micro-batches than rank 1's long ones: both ran rank 1's count.
    (alone_0, ran_0), (alone_1, ran_1) = two_rank_result[packed]["counts"]
    assert alone_0 < alone_1 and ran_0 == ran_1 == alone_1
    for name, param in model.named_parameters():
        torch.testing.assert_close(two_rank_result[packed]["grads"][name], param.grad, atol=1e-6, rtol=1e-4, msg=name)
