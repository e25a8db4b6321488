"""On-policy distillation's numbers against direct computations (docs/distillation.md):

1. every loss mode through the training path (hidden states -> rlcore's chunked log-prob head, with the teacher's
   top-k ids gathered -> rlcore.algos.distill), fp32, against the dense float64 formula over the whole vocabulary:
   the loss and its gradients on the hidden states and the output layer;
2. (in the vLLM venv) a teacher's scores on vLLM (prompt log-probs) against its FSDP2 forward: sampled-token
   log-probs, top-k log-probs and ids, fp32.

    .venv/bin/python bench/distill_parity.py
    .cache/vllm_venv/bin/python bench/distill_parity.py --teachers
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

import torch

from rlcore.algos.distill import DISTILL_LOSSES, ESTIMATORS
from rlcore.models.logits import token_log_probs

N, H, V, K = 256, 64, 1000, 16  # response tokens, hidden size, vocabulary, teacher top-k


def dense_loss(mode: str, z: torch.Tensor, teacher: torch.Tensor, sampled: torch.Tensor, ids: torch.Tensor, eps: float) -> torch.Tensor:
    """The formula over the whole vocabulary, float64, straight from verl's docs (no rlcore code)."""
    q = z.log_softmax(-1)
    if mode in ESTIMATORS:
        r = q.gather(-1, sampled[:, None])[:, 0] - teacher.gather(-1, sampled[:, None])[:, 0]
        return {"k1": r, "kl": r, "abs": r.abs(), "k2": 0.5 * r * r, "mse": 0.5 * r * r,
                "k3": (torch.exp(-r) + r - 1).clamp(-10, 10), "low_var_kl": (torch.exp(-r) + r - 1).clamp(-10, 10)}[mode]
    p_s, q_s = teacher.gather(-1, ids), q.gather(-1, ids)
    kl = (p_s.exp() * (p_s - q_s)).sum(-1)
    if mode == "forward_kl_topk":
        return kl.clamp_min(0)
    p_t, q_t = 1 - p_s.exp().sum(-1), (1 - q_s.exp().sum(-1)).clamp(eps, 1)
    return (kl + p_t * (p_t.log() - q_t.log())).clamp_min(0)


def loss_parity() -> list[tuple[str, float, float, float]]:
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g) * 0.3
    teacher = (torch.randn(N, V, generator=g, dtype=torch.float64) * 2).log_softmax(-1)
    sampled = torch.randint(0, V, (N,), generator=g)
    top, ids = teacher.topk(K, -1)
    rows = []
    for mode in DISTILL_LOSSES.names():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        stats = token_log_probs(h, w, torch.cat([sampled[:, None], ids], -1))  # the head: sampled token, then the top-k
        fn = DISTILL_LOSSES.get(mode)
        if mode in ESTIMATORS:
            ours, _ = fn(stats.log_probs[:, 0], teacher.gather(-1, sampled[:, None])[:, 0].float())
        else:
            ours, _ = fn(stats.log_probs[:, 1:], top.float(), tail_mass_eps=1e-7)
        ours.sum().backward()
        h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
        ref = dense_loss(mode, h64 @ w64.t(), teacher, sampled, ids, 1e-7)
        ref.sum().backward()
        rows.append((mode, float((ours.detach().double() - ref.detach()).abs().max()), float((h.grad.double() - h64.grad).abs().max()),
                     float((w.grad.double() - w64.grad).abs().max())))
    return rows


def teacher_parity() -> dict[str, float]:
    """A tiny Qwen2 (fp32, head_dim 32 for vLLM's CPU attention) scored by both teacher engines."""
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.controller.worker import free_port
    from rlcore.data.micro_batches import MicroBatchSpec
    from rlcore.engine.base import EngineSpec, TokenRequest
    from rlcore.engine.factory import build_engine
    from rlcore.protocol import DataProto, position_ids_from_mask
    from rlcore.rollout.vllm_teacher import VLLMTeacher
    from rlcore.workers.common import run_forward

    path = tempfile.mkdtemp()
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)).save_pretrained(path)
    g = torch.Generator().manual_seed(1)
    rows, prompt, response = 8, 12, 20
    ids = torch.randint(1, 512, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, :3] = 0  # uneven prompts, left-padded
    mask[1::3, -5:] = 0  # uneven responses, right-padded
    batch = DataProto.from_dict({"input_ids": ids * mask, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
                                 "responses": (ids * mask)[:, prompt:]})
    vllm = VLLMTeacher(path, dtype="float32", topk=K, max_model_len=64).score(ids * mask, mask, response, K, 1.0)
    if not dist.is_initialized():  # vLLM in-process made the world of one already
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    engine = build_engine("fsdp2", EngineSpec(model_path=path, trainable=False), torch.device("cpu"))
    micro = MicroBatchSpec(rows=rows)
    native = run_forward(engine, batch, micro, lambda o, mb: {k: o[k] for k in ("log_probs", "topk_log_probs", "topk_ids")},
                         TokenRequest(topk=K)).batch
    real = mask[:, prompt:].bool()
    return {"sampled log-prob max |diff|": float((native["log_probs"] - vllm["log_probs"])[real].abs().max()),
            "top-k log-prob max |diff|": float((native["topk_log_probs"] - vllm["topk_log_probs"])[real].abs().max()),
            "top-k ids equal": float((native["topk_ids"] == vllm["topk_ids"])[real].float().mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teachers", action="store_true", help="also native vs vLLM teacher scores (needs vLLM)")
    args = p.parse_args()
    print(f"loss parity: fp32 training path vs the dense float64 formula; {N} tokens, vocabulary {V}, teacher top-{K}")
    print(f"{'loss_mode':<22} {'loss':>9} {'d hidden':>9} {'d weight':>9}")
    for mode, loss, dh, dw in loss_parity():
        print(f"{mode:<22} {loss:9.1e} {dh:9.1e} {dw:9.1e}")
    if args.teachers:
        if importlib.util.find_spec("vllm") is None:
            raise SystemExit("--teachers needs vLLM: run it with .cache/vllm_venv/bin/python")
        for what, value in teacher_parity().items():
            print(f"teacher native vs vLLM: {what} {value:.2e}")


if __name__ == "__main__":
    main()
