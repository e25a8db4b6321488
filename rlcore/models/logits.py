"""Log-probs and entropy of response tokens, straight from hidden states and the vocabulary projection.

`token_log_probs` never materialises `[tokens, vocab]` logits for a whole micro-batch: it projects a chunk of
tokens at a time (forward, and again in backward instead of keeping the logits), and under tensor parallelism each
rank projects only its vocabulary shard, combining max / sum-exp / target logit / E[z] across the shard group.
Both training engines compute log-probs this way; losses receive log-probs and entropy, never logits.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import is_fake

from rlcore.plan.constants import LOGITS_CHUNK_BYTES
from rlcore.utils.dist import all_reduce


def response_logits(logits: torch.Tensor, response_len: int, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict the response tokens: positions [-R-1, -1) of `[batch, seq, vocab]` (next-token shift).

    Divided by the sampling temperature so log-probs match the distribution the rollout sampled from.
    """
    return scale_logits(logits[:, -response_len - 1 : -1, :], temperature)


def scale_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """float32 logits divided by the sampling temperature (0 = greedy and 1 leave them unchanged)."""
    out = logits.float()
    return out / temperature if temperature not in (0.0, 1.0) else out


def gather_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token]: `[batch, len, vocab]`, `[batch, len]` -> `[batch, len]`."""
    return torch.gather(logits.log_softmax(dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z, per position: `[batch, len, vocab]` -> `[batch, len]`."""
    probs = logits.softmax(dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def chunk_tokens(vocab_per_rank: int) -> int:
    """Tokens projected at once: one float32 `[chunk, vocab_per_rank]` block is at most LOGITS_CHUNK_BYTES."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_per_rank))


# use_torch_compile: below this many vocabulary columns per rank the compile (seconds per process) never pays back.
COMPILE_MIN_VOCAB = 8192
_COMPILED: dict[str, Callable] = {}


def _kernel(fn: Callable, compiled: bool, example: torch.Tensor) -> Callable:
    """`fn`, or its torch.compile'd form (built once per process, dynamic: chunk lengths vary). Eager on fake tensors
    (the memory rehearsal, rlcore.cli.rehearsal): compiled code runs on real storage only."""
    if not compiled or is_fake(example):
        return fn
    if fn.__name__ not in _COMPILED:
        _cache_per_cpu_capability()
        _COMPILED[fn.__name__] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn.__name__]


def _cache_per_cpu_capability() -> None:
    """torch inductor's on-disk cache key leaves out ATEN_CPU_CAPABILITY, while its CPU code depends on it: kernels
    compiled under the machine's AVX-512 and then loaded under ATEN_CPU_CAPABILITY=avx2 gave log-probs off by up to
    4.7 (torch 2.13; each capability alone matches eager). So each capability set that way compiles into its own
    cache directory, unless the user chose one. (Importing torch._dynamo already wrote the default into the
    environment; inductor reads it again at each use.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability, chosen = os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if capability and chosen in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability}"


def _chunk_stats(z: torch.Tensor, col: torch.Tensor, with_entropy: bool, with_sum_pi_squared: bool) -> tuple[torch.Tensor, ...]:
    """One unsharded chunk's (target log-prob, logsumexp, top log-prob, E_p[z], sum p^2): the elementwise work after
    the chunk's GEMM, which torch.compile fuses into a few passes over `[chunk, vocab]` instead of one per op."""
    m = z.max(-1).values
    lse = m + torch.exp(z - m[:, None]).sum(-1).log()
    expected_z = (torch.exp(z - lse[:, None]) * z).sum(-1) if with_entropy else torch.zeros_like(lse)
    sum_pi_squared = torch.exp(2.0 * (z - lse[:, None])).sum(-1) if with_sum_pi_squared else torch.zeros_like(lse)
    return z.gather(-1, col[:, None]).squeeze(-1) - lse, lse, m - lse, expected_z, sum_pi_squared


def _chunk_grad(z: torch.Tensor, lse: torch.Tensor, col: torch.Tensor, g: torch.Tensor, expected_z: torch.Tensor,
                g_entropy: torch.Tensor) -> torch.Tensor:
    """d loss / dz of one unsharded chunk: g (onehot - p) - g_entropy p (z - E_p[z]) (zeros for an absent term)."""
    p = torch.exp(z - lse[:, None])
    dz = -p * (g[:, None] + g_entropy[:, None] * (z - expected_z[:, None]))
    return dz.scatter_add(-1, col[:, None], g[:, None])


class _VocabShard:
    """This rank's columns of the vocabulary: [start, start + local) of which those < vocab_size are real (the
    rest is padding added to divide the vocabulary by the TP size, masked out of every softmax). `compiled`:
    use_torch_compile, honoured for a whole vocabulary (no tensor parallelism) of COMPILE_MIN_VOCAB columns or more."""

    def __init__(self, start: int, local: int, vocab_size: int, group, compiled: bool = False, softcap: float | None = None,
                 scale: float = 1.0) -> None:
        self.start, self.local, self.group, self.softcap, self.scale = start, local, group, softcap, scale
        self.num_padding = max(0, start + local - vocab_size)
        self.whole = group is None and self.num_padding == 0 and start == 0
        self.compiled = compiled and self.whole and local >= COMPILE_MIN_VOCAB

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.group is not None:
            all_reduce(tensor, op=op, group=self.group)
        return tensor

    def scaled_logits(self, hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(`[chunk, local]` float32 logits, scaled, soft-capped, then / temperature, with -inf padding columns; the
        derivative of the scale and cap, d final / d logits = scale (1 - tanh^2), or None when both are identities)."""
        z = (hidden @ weight.t()).float()
        cap_grad = None
        if self.scale != 1.0:  # Cohere's logit_scale, Granite's 1 / logits_scaling
            z = z * self.scale
        if self.softcap is not None:  # Gemma's final_logit_softcapping: softcap * tanh(z / softcap)
            bent = torch.tanh(z / self.softcap)
            z, cap_grad = bent * self.softcap, 1.0 - bent * bent
        if self.scale != 1.0:
            cap_grad = self.scale if cap_grad is None else cap_grad * self.scale
        if temperature not in (0.0, 1.0):
            z = z / temperature
        if self.num_padding:
            z[:, self.local - self.num_padding :] = float("-inf")
        return z, cap_grad

    def target(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(local column of each token clamped into range, whether this rank owns it)."""
        local = tokens - self.start
        owned = (local >= 0) & (local < self.local)
        return local.clamp(0, self.local - 1), owned


def _softmax_stats(z: torch.Tensor, shard: _VocabShard, with_expected: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(max, logsumexp, softmax, E_p[z] if asked) of rows of z whose columns are spread over the shard group."""
    m = shard.all_reduce(z.max(-1).values, dist.ReduceOp.MAX)
    lse = m + shard.all_reduce(torch.exp(z - m[:, None]).sum(-1)).log()
    p = torch.exp(z - lse[:, None])
    expected_z = shard.all_reduce((p * z.nan_to_num(neginf=0.0)).sum(-1)) if with_expected else None
    return m, lse, p, expected_z


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, with_entropy, with_sum_pi_squared, shard, reduce_hidden_grad):
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(num_tokens, dtype=torch.float32)
        lse = hidden.new_empty(num_tokens, dtype=torch.float32)
        top_log_probs = hidden.new_empty(num_tokens, dtype=torch.float32)
        expected_z = hidden.new_zeros(num_tokens, dtype=torch.float32)
        sum_pi_squared = hidden.new_zeros(num_tokens, dtype=torch.float32)
        step = chunk_tokens(shard.local)
        for s in range(0, num_tokens, step):
            z, _ = shard.scaled_logits(hidden[s : s + step], weight, temperature)
            if shard.whole:  # one function of the chunk (compiled with use_torch_compile)
                stats = _kernel(_chunk_stats, shard.compiled, z)(z, tokens[s : s + step], with_entropy, with_sum_pi_squared)
                (log_probs[s : s + step], lse[s : s + step], top_log_probs[s : s + step], expected_z[s : s + step],
                 sum_pi_squared[s : s + step]) = stats
                continue
            m, lse[s : s + step], p, ez = _softmax_stats(z, shard, with_entropy)
            if with_sum_pi_squared:  # padding columns have p = 0
                sum_pi_squared[s : s + step] = shard.all_reduce((p * p).sum(-1))
            col, owned = shard.target(tokens[s : s + step])
            target_z = shard.all_reduce(z.gather(-1, col[:, None]).squeeze(-1) * owned)
            log_probs[s : s + step] = target_z - lse[s : s + step]
            # The most likely token's log-prob: the target is the greedy choice exactly when its z is the max, and
            # subtracting the same lse keeps that equality, so `log_probs >= top_log_probs` is a greedy match.
            top_log_probs[s : s + step] = m - lse[s : s + step]
            if with_entropy:
                expected_z[s : s + step] = ez
        # Backward recomputes each chunk's logits from these (no [tokens, vocab] tensor is kept alive).
        ctx.save_for_backward(hidden, weight, tokens, lse, expected_z)
        ctx.temperature, ctx.shard, ctx.with_entropy, ctx.reduce_hidden_grad = temperature, shard, with_entropy, reduce_hidden_grad
        entropy = lse - expected_z if with_entropy else torch.zeros_like(lse)
        ctx.mark_non_differentiable(top_log_probs, sum_pi_squared)
        return log_probs, entropy, top_log_probs, sum_pi_squared

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, _grad_top, _grad_sum_pi_squared):
        hidden, weight, tokens, lse, expected_z = ctx.saved_tensors
        shard, temperature = ctx.shard, ctx.temperature
        with_entropy = ctx.with_entropy and grad_entropy is not None
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        step = chunk_tokens(shard.local)
        scale = 1.0 / temperature if temperature not in (0.0, 1.0) else 1.0
        for s in range(0, hidden.shape[0], step):
            h = hidden[s : s + step]
            z, cap_grad = shard.scaled_logits(h, weight, temperature)
            if shard.whole:
                zeros = torch.zeros_like(lse[s : s + step])
                g = grad_log_probs[s : s + step] if grad_log_probs is not None else zeros
                g_entropy = grad_entropy[s : s + step] if with_entropy else zeros
                dz = _kernel(_chunk_grad, shard.compiled, z)(z, lse[s : s + step], tokens[s : s + step], g, expected_z[s : s + step], g_entropy)
                dz = (dz * (scale if cap_grad is None else cap_grad * scale)).to(hidden.dtype)
                grad_hidden[s : s + step] = dz @ weight
                grad_weight += (dz.t() @ h).float()
                continue
            p = torch.exp(z - lse[s : s + step, None])
            # d log p(t) / dz = onehot(t) - p;  d H / dz = -p (z - E_p[z])
            dz = torch.zeros_like(z)
            if grad_log_probs is not None:
                g = grad_log_probs[s : s + step]
                dz -= p * g[:, None]
                col, owned = shard.target(tokens[s : s + step])
                dz.scatter_add_(-1, col[:, None], (g * owned)[:, None])
            if with_entropy:
                centred = z.nan_to_num(neginf=0.0) - expected_z[s : s + step, None]
                dz -= p * centred * grad_entropy[s : s + step, None]
            dz = (dz * (scale if cap_grad is None else cap_grad * scale)).to(hidden.dtype)
            grad_hidden[s : s + step] = dz @ weight
            grad_weight += (dz.t() @ h).float()
        # Each shard saw only its vocabulary columns: the hidden state's gradient is the sum over shards (unless the
        # caller sums it itself, e.g. a sequence-parallel gather whose backward reduce-scatters).
        if ctx.reduce_hidden_grad:
            shard.all_reduce(grad_hidden)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None, None


class TokenStats(NamedTuple):
    """Per-token float32 `[tokens]` statistics of the distribution softmax(z / temperature) at each position."""

    log_probs: torch.Tensor             # log p(token)
    entropy: torch.Tensor | None        # H(p) (None unless asked)
    top_log_probs: torch.Tensor         # log p of the most likely token (no gradient)
    sum_pi_squared: torch.Tensor | None  # sum over the vocabulary of p^2 (no gradient; None unless asked): OTB's score
                                         # norm ||d log p(token) / dz||^2 = 1 - 2 p(token) + sum p^2 needs it


def token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = False, vocab_start: int = 0, vocab_size: int | None = None,
                    group=None, reduce_hidden_grad: bool = True, compiled: bool = False,
                    with_sum_pi_squared: bool = False, softcap: float | None = None, scale: float = 1.0) -> TokenStats:
    """log softmax(hidden @ weight.T / temperature)[token], (optionally) the entropy of that distribution and its
    sum of squared probabilities, and the log-prob of its most likely token (`log_probs >= top` marks tokens greedy
    decoding would pick).

    hidden `[tokens, hidden]`, weight `[vocab_per_rank, hidden]` (this rank's rows `vocab_start ...` of the
    vocabulary projection; the whole of it when `group` is None), tokens `[tokens]` global ids. Columns at or past
    `vocab_size` (TP padding) are excluded. Collective over `group` (every rank of the tensor-parallel group calls
    it with the same hidden and tokens). `reduce_hidden_grad=False` leaves hidden's gradient as this shard's partial
    sum. `compiled` (use_torch_compile): the per-chunk elementwise work runs torch.compile'd (see _VocabShard for when).
    `scale` then `softcap` (Gemma's final_logit_softcapping): the logits are softcap * tanh(scale * logits / softcap)
    before the temperature.
    """
    shard = _VocabShard(vocab_start, weight.shape[0], vocab_size or vocab_start + weight.shape[0], group, compiled, softcap, scale)
    log_probs, entropy, top, sum_pi_squared = _TokenLogProbs.apply(hidden, weight, tokens, temperature, with_entropy,
                                                                   with_sum_pi_squared, shard, reduce_hidden_grad)
    return TokenStats(log_probs, entropy if with_entropy else None, top, sum_pi_squared if with_sum_pi_squared else None)


# The channels a causal-LM head stacks along the last dim, in this order (a channel not asked for is zeros).
TOKEN_CHANNELS = TokenStats._fields


def stack_channels(stats: TokenStats, shape: torch.Size) -> torch.Tensor:
    """`[*shape, len(TOKEN_CHANNELS)]`. Stacked, not viewed: FSDP2 hooks the model's output, and an output that is
    a view defeats the hook."""
    zeros = torch.zeros_like(stats.log_probs)
    return torch.stack([(t if t is not None else zeros).view(shape) for t in stats], -1)


def channel_names(request) -> tuple[str, ...]:
    """The channels handed to losses and log-prob passes (rlcore.engine.base.TokenRequest): the optional ones only
    when they were computed."""
    skipped = {"entropy": not request.entropy, "sum_pi_squared": not request.sum_pi_squared}
    return tuple(name for name in TOKEN_CHANNELS if not skipped.get(name, False))
