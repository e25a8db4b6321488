"""Every family rlcore has a module for (rlcore/families/), tiny and random, against HF's own eager forward of each
sequence alone, in one run on this CPU (fp32): the largest difference of the training engine's per-token log-probs
and of its gradients, padded and packed, and of the native rollout's greedy log-probs against the training forward
after a weight sync. Prints one markdown row per family (docs/models.md holds a run's table, with its commit).

    python bench/model_families.py                       # every tiny family
    python bench/model_families.py tiny-gemma2 tiny-qwen3.5
    python bench/model_families.py --generic             # model types rlcore has no module for (the generic path)
"""

from __future__ import annotations

import argparse
import tempfile

import torch

ROWS, PROMPT, RESPONSE = 6, 7, 5  # prompt + response longer than the tiny families' 8-token sliding windows
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
_WINDOWS = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
# Model types transformers ships that rlcore has no module for, each with what makes it differ from Llama's block.
GENERIC = {"olmo2": {}, "phi3": {}, "granite": dict(logits_scaling=8.0), "gemma4_text": dict(head_dim=16, global_head_dim=16, **_WINDOWS),
           "cohere2": dict(logit_scale=0.25, **_WINDOWS), "exaone4": _WINDOWS, "olmoe": dict(num_experts=4, num_experts_per_tok=2),
           "mixtral": dict(num_local_experts=4, num_experts_per_tok=2)}


def batch(vocab: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts of uneven lengths, right-padded responses of uneven lengths."""
    from rlcore.protocol import position_ids_from_mask

    g = torch.Generator().manual_seed(0)
    prompt_mask = (torch.arange(PROMPT) >= torch.randint(0, PROMPT - 1, (ROWS, 1), generator=g)).long()
    response_mask = (torch.arange(RESPONSE) < torch.randint(1, RESPONSE + 1, (ROWS, 1), generator=g)).long()
    responses = torch.randint(6, vocab, (ROWS, RESPONSE), generator=g) * response_mask
    mask = torch.cat([prompt_mask, response_mask], -1)
    ids = torch.cat([torch.randint(6, vocab, (ROWS, PROMPT), generator=g) * prompt_mask, responses], -1)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask), "responses": responses,
            "response_mask": response_mask}


def hf_reference(model_dir: str, b: dict) -> tuple[torch.Tensor, dict]:
    """HF's eager forward of each sequence alone: response log-probs and the gradients of their sum."""
    from transformers import AutoModelForCausalLM

    from rlcore.models.logits import gather_log_probs

    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", local_files_only=True)
    mask, lengths = b["attention_mask"].bool(), b["response_mask"].sum(-1).tolist()
    out = torch.zeros(ROWS, RESPONSE)
    for row in range(ROWS):
        ids = b["input_ids"][row][mask[row]][None]
        logits = hf(input_ids=ids, use_cache=False).logits[0].float()
        first = ids.shape[1] - lengths[row]
        out[row, : lengths[row]] = gather_log_probs(logits[first - 1 : -1], b["responses"][row, : lengths[row]])
    out.sum().backward()
    return out.detach(), {n: p.grad for n, p in hf.named_parameters()}


def engine_differences(model_dir: str, b: dict, expected: torch.Tensor, grads: dict, packed: bool) -> tuple[float, float]:
    from rlcore.engine.base import EngineSpec, TokenRequest
    from rlcore.engine.fsdp2 import FSDP2Engine
    from rlcore.protocol import DataProto

    engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=packed), torch.device("cpu"))
    data, valid = DataProto.from_dict(b), b["response_mask"].bool()
    log_probs = engine.forward([data], lambda out, mb: {"lp": out["log_probs"]}, TokenRequest())[0]["lp"]
    engine.forward_backward([data], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
    grad = max(float((p.grad.full_tensor() - grads[n]).abs().max()) for n, p in engine.model.named_parameters())
    return float((log_probs[valid] - expected[valid]).abs().max()), grad


def native_difference(model_dir: str, b: dict) -> str:
    """The native rollout after a sync of the training weights: its greedy log-probs against the training forward."""
    from rlcore.engine.base import EngineSpec, TokenRequest
    from rlcore.engine.fsdp2 import FSDP2Engine
    from rlcore.protocol import DataProto
    from rlcore.rollout.base import SamplingParams, assemble_sequences
    from rlcore.rollout.native import NativeRollout
    from rlcore.rollout.weight_sync import sync_weights

    engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=True), torch.device("cpu"))
    try:
        rollout = NativeRollout(model_dir, pad_token_id=0, device=torch.device("cpu"))
    except ValueError as err:  # a recurrent layer: rollout.name=vllm
        return "refused: " + str(err).split(";")[-1].strip()
    sync_weights(engine, rollout)
    prompts, mask = b["input_ids"][:, :PROMPT], b["attention_mask"][:, :PROMPT]
    out = rollout.generate(prompts, mask, SamplingParams(max_tokens=RESPONSE, do_sample=False))
    seq = assemble_sequences(prompts, mask, out)
    seq.update(responses=out.responses, response_mask=out.response_mask)
    train = engine.forward([DataProto.from_dict(seq)], lambda o, mb: {"lp": o["log_probs"]}, TokenRequest())[0]["lp"]
    valid = out.response_mask.bool()
    return f"{float((train[valid] - out.response_log_probs[valid]).abs().max()):.1e}"


def _generic_dir(path: str, model_type: str, tokenizer) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **_TINY, **GENERIC[model_type])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="tiny shapes (default: every one of rlcore.models.random_init.TINY_FAMILIES)")
    parser.add_argument("--generic", action="store_true", help="model types without a module instead (GENERIC)")
    args = parser.parse_args(argv)
    import os
    import socket

    import torch.distributed as dist

    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.models.random_init import TINY_FAMILIES, build_config, build_model_dir

    with socket.socket() as s:  # a free port for the engines' one-rank gloo group
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    tokenizer = build_char_tokenizer()
    print("| family | padded: log-probs / grads | packed: log-probs / grads | native rollout after a sync |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in (GENERIC if args.generic else args.families or TINY_FAMILIES):
            model_dir = _generic_dir(f"{root}/{name}", name, tokenizer) if args.generic else build_model_dir(f"{root}/{name}", name, tokenizer)
            b = batch(len(tokenizer) if args.generic else build_config(name, tokenizer).vocab_size)
            expected, grads = hf_reference(model_dir, b)
            cells = [engine_differences(model_dir, b, expected, grads, packed) for packed in (False, True)]
            print(f"| {name} | " + " | ".join(f"{lp:.1e} / {g:.1e}" for lp, g in cells) + f" | {native_difference(model_dir, b)} |", flush=True)


if __name__ == "__main__":
    main()
