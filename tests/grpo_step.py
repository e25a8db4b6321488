"""One GRPO step of the hybrid worker, in pieces the worker-level tests share (model families, router replay, the
memory ledger, Megatron's MoE): prompts repeated N times, a worker config over a tiny model, the greedy rollout
checked against the training forward, and a GRPO batch with a rule reward."""

import numpy as np
import torch
from e2e_utils import tiny_cfg
from omegaconf import OmegaConf

from rlcore.algos import compute_advantage
from rlcore.protocol import DataProto, position_ids_from_mask

N = 4  # samples per prompt


def prompts_batch(vocab: int, num_prompts: int = 3, length: int = 6, seed: int = 0) -> DataProto:
    """Left-padded prompts, each repeated N times (interleaved, as the trainer repeats them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, vocab, (num_prompts, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # uneven prompt lengths
    ids = ids * mask
    ids, mask = ids.repeat_interleave(N, 0), mask.repeat_interleave(N, 0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)})


def family_cfg(model_dir, task_dir, out_dir, *overrides, config_name="ppo_trainer"):
    cfg = tiny_cfg(model_dir, task_dir, out_dir, f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.response_length=5",
                   "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                   "actor_rollout_ref.actor.optim.lr=1e-2", *overrides, config_name=config_name)
    return OmegaConf.to_container(cfg, resolve=True)


def greedy_matches_training(worker, prompts: DataProto) -> DataProto:
    """Syncs, decodes greedily, and checks the rollout against the training forward; returns the rollout."""
    out = worker.generate_sequences(DataProto(prompts.batch, dict(prompts.non_tensor_batch), {"validate": True, "greedy": True}))
    train = worker.compute_log_prob(out).batch
    if train is None:  # not its replica's output rank (a TP peer): rank 0 checks
        return out
    train = train["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    assert mask.sum() > 0
    torch.testing.assert_close(train[mask], out.batch["rollout_log_probs"][mask], atol=1e-5, rtol=1e-5)
    return out


def grpo_batch(out: DataProto, worker) -> DataProto | None:
    """Old and reference log-probs, a rule reward (responses with more even tokens score higher, plus 0.5 on odd rows
    so that a group of identical greedy responses still has a spread) and GRPO advantages.
    None on a rank that is not its replica's output rank (the passes are collective; the answer comes from one)."""
    old, ref = worker.compute_log_prob(out), worker.compute_ref_log_prob(out)
    if old.batch is None:
        return None
    batch = out.union(old).union(ref)
    mask = batch.batch["response_mask"]
    score = ((batch.batch["responses"] % 2 == 0) * mask).sum(-1).float() / mask.sum(-1).clamp(min=1) + 0.5 * (torch.arange(len(mask)) % 2)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(mask)), mask.sum(-1).clamp(min=1) - 1] = score
    uid = np.repeat(np.arange(len(mask) // N), N)
    batch.batch["advantages"], batch.batch["returns"] = compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask, index=uid)
    return batch
