"""Packed sequences through recurrent token mixers (Qwen3.5's and Qwen3-Next's Gated DeltaNet layers).

A recurrent layer carries a state from token to token: in a packed row, each sequence must start from a fresh
state. HF's torch path does not restart it (its conv and delta-rule fallbacks mix the packed sequences with no error,
or refuse `cu_seq_lens` outright); flash-linear-attention's CUDA kernels take `cu_seqlens`, but they are optional.
Here each such module runs once per sequence of the packed row, which is each sequence alone: exact on any device.
A block whose token mixer is neither attention nor a recurrent module its family names cannot be packed: the engine
then runs padded batches and says so.
"""

from __future__ import annotations

import functools

import torch

# What only a packed call carries: the recurrent module sees one sequence at a time, unpacked.
_PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def restart_per_sequence(module: torch.nn.Module) -> None:
    """Makes `module` (called with `hidden_states` `[1, total_tokens, hidden]` and the packing kwargs) run once per
    packed sequence; unpacked calls pass through."""
    forward = module.forward

    @functools.wraps(forward)
    def per_sequence(*args, **kwargs):
        cu_seq_lens = kwargs.get("cu_seq_lens_q")
        if cu_seq_lens is None:
            return forward(*args, **kwargs)
        hidden = kwargs.pop("hidden_states") if "hidden_states" in kwargs else args[0]
        args = args[1:] if args and hidden is args[0] else args
        rest = {k: v for k, v in kwargs.items() if k not in _PACKING_KWARGS}
        bounds = cu_seq_lens.tolist()
        return torch.cat([forward(*args, hidden_states=hidden[:, start:end], **rest) for start, end in zip(bounds[:-1], bounds[1:])], dim=1)

    module.forward = per_sequence


def prepare_packing(blocks: torch.nn.ModuleList, recurrent: str | None) -> str | None:
    """Readies every block for packed rows: attention blocks as they are, each `recurrent` token mixer restarted per
    sequence. Returns why the blocks cannot be packed (a token mixer rlcore does not know), else None."""
    for index, block in enumerate(blocks):
        mixer = getattr(block, recurrent, None) if recurrent else None
        if mixer is not None:
            restart_per_sequence(mixer)
        elif not hasattr(block, "self_attn"):
            children = ", ".join(name for name, _ in block.named_children())
            return (f"decoder block {index} ({type(block).__name__}: {children}) mixes tokens without self_attn, and no family "
                    "module says how to restart it at each packed sequence")
    return None
