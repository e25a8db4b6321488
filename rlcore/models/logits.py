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

from rlcore.utils.dist import all_gather_flat, all_reduce
from rlcore.utils.sizes import LOGITS_CHUNK_BYTES


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


def _chunk_stats(z: torch.Tensor, cols: torch.Tensor, with_entropy: bool, with_sum_pi_squared: bool) -> tuple[torch.Tensor, ...]:
    """One unsharded chunk's (`[chunk, C]` log-probs of the token columns, then `[chunk]` logsumexp, top log-prob,
    E_p[z], sum p^2): the elementwise work after the chunk's GEMM, which torch.compile fuses into a few passes over
    `[chunk, vocab]` instead of one per op."""
    m = z.max(-1).values
    lse = m + torch.exp(z - m[:, None]).sum(-1).log()
    expected_z = (torch.exp(z - lse[:, None]) * z).sum(-1) if with_entropy else torch.zeros_like(lse)
    sum_pi_squared = torch.exp(2.0 * (z - lse[:, None])).sum(-1) if with_sum_pi_squared else torch.zeros_like(lse)
    return z.gather(-1, cols) - lse[:, None], lse, m - lse, expected_z, sum_pi_squared


def _chunk_grad(z: torch.Tensor, lse: torch.Tensor, cols: torch.Tensor, g: torch.Tensor, expected_z: torch.Tensor,
                g_entropy: torch.Tensor) -> torch.Tensor:
    """d loss / dz of one unsharded chunk, g `[chunk, C]` the gradient of each column's log-prob:
    sum_c g_c (onehot(col_c) - p) - g_entropy p (z - E_p[z]) (zeros for an absent term; a token in two columns
    gets both columns' g)."""
    p = torch.exp(z - lse[:, None])
    dz = -p * (g.sum(-1)[:, None] + g_entropy[:, None] * (z - expected_z[:, None]))
    return dz.scatter_add(-1, cols, g)


class _VocabShard:
    """This rank's columns of the vocabulary: [start, start + local) of which those < vocab_size are real (the
    rest is padding added to divide the vocabulary by the TP size, masked out of every softmax). `compiled`:
    use_torch_compile, honoured for a whole vocabulary (no tensor parallelism) of COMPILE_MIN_VOCAB columns or more.
    `suppressed`: global ids no rollout may sample (masked out of every softmax like the padding)."""

    def __init__(self, start: int, local: int, vocab_size: int, group, compiled: bool = False, softcap: float | None = None,
                 scale: float = 1.0, suppressed: tuple[int, ...] = ()) -> None:
        self.start, self.local, self.group, self.softcap, self.scale = start, local, group, softcap, scale
        self.num_padding = max(0, start + local - vocab_size)
        self.suppressed = [i - start for i in suppressed if start <= i < start + local]  # this rank's columns of them
        self.whole = group is None and self.num_padding == 0 and start == 0 and not suppressed
        self.compiled = compiled and self.whole and local >= COMPILE_MIN_VOCAB

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.group is not None:
            all_reduce(tensor, op=op, group=self.group)
        return tensor

    def all_gather_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        """`[rows, k]` on each rank -> `[rows, world * k]`, rank 0's columns first."""
        if self.group is None:
            return tensor
        world = dist.get_world_size(self.group)
        out = tensor.new_empty(world * tensor.numel())
        all_gather_flat(out, tensor.contiguous().view(-1), group=self.group)
        return out.view(world, *tensor.shape).transpose(0, 1).reshape(tensor.shape[0], -1)

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
        if self.suppressed:
            z[:, self.suppressed] = float("-inf")
        return z, cap_grad

    def target(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(local column of each token clamped into range, whether this rank owns it), both shaped like `tokens`."""
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


def _shard_stats(z: torch.Tensor, tokens: torch.Tensor, shard: _VocabShard, with_entropy: bool,
                 with_sum_pi_squared: bool) -> tuple[torch.Tensor, ...]:
    """_chunk_stats of a chunk whose columns are spread over the shard group (or padded): the same five outputs."""
    m, lse, p, expected_z = _softmax_stats(z, shard, with_entropy)
    # Padding columns have p = 0.
    sum_pi_squared = shard.all_reduce((p * p).sum(-1)) if with_sum_pi_squared else torch.zeros_like(lse)
    col, owned = shard.target(tokens)
    # Each token's logit lives on one rank; the others add 0 (where, not a product: a padding column is -inf).
    target_z = shard.all_reduce(torch.where(owned, z.gather(-1, col), 0.0))
    # The most likely token's log-prob: the target is the greedy choice exactly when its z is the max, and
    # subtracting the same lse keeps that equality, so `log_probs >= top_log_probs` is a greedy match.
    return target_z - lse[:, None], lse, m - lse, expected_z if with_entropy else torch.zeros_like(lse), sum_pi_squared


def _shard_grad(z: torch.Tensor, lse: torch.Tensor, tokens: torch.Tensor, g: torch.Tensor, expected_z: torch.Tensor,
                g_entropy: torch.Tensor, shard: _VocabShard) -> torch.Tensor:
    """_chunk_grad of this shard's columns: the onehot terms only on the rank that owns the token."""
    p = torch.exp(z - lse[:, None])
    centred = z.nan_to_num(neginf=0.0) - expected_z[:, None]  # padding: p = 0, and 0 * -inf would be nan
    dz = -p * (g.sum(-1)[:, None] + g_entropy[:, None] * centred)
    col, owned = shard.target(tokens)
    return dz.scatter_add(-1, col, g * owned)


def _chunk_topk(z: torch.Tensor, lse: torch.Tensor, k: int, shard: _VocabShard) -> tuple[torch.Tensor, torch.Tensor]:
    """(`[chunk, k]` the k largest log-probs, descending, `[chunk, k]` their global token ids). Across shards: each
    rank's own top k (padding columns are -inf and k <= vocab_size, so they never make the cut), gathered, and the
    top k of those."""
    values, cols = z.topk(min(k, shard.local), -1)
    ids = cols + shard.start
    if shard.group is not None:
        values, ids = shard.all_gather_columns(values), shard.all_gather_columns(ids)
        values, pick = values.topk(k, -1)
        ids = ids.gather(-1, pick)
    return values - lse[:, None], ids


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, with_entropy, with_sum_pi_squared, topk, shard, reduce_hidden_grad):
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(tokens.shape, dtype=torch.float32)  # [tokens, C]
        lse = hidden.new_empty(num_tokens, dtype=torch.float32)
        top_log_probs = hidden.new_empty(num_tokens, dtype=torch.float32)
        expected_z = hidden.new_zeros(num_tokens, dtype=torch.float32)
        sum_pi_squared = hidden.new_zeros(num_tokens, dtype=torch.float32)
        topk_log_probs = hidden.new_empty(num_tokens, topk, dtype=torch.float32)
        topk_ids = tokens.new_empty(num_tokens, topk)
        step = chunk_tokens(shard.local)
        for s in range(0, num_tokens, step):
            rows = slice(s, s + step)
            z, _ = shard.scaled_logits(hidden[rows], weight, temperature)
            if shard.whole:  # one function of the chunk (compiled with use_torch_compile)
                stats = _kernel(_chunk_stats, shard.compiled, z)(z, tokens[rows], with_entropy, with_sum_pi_squared)
            else:
                stats = _shard_stats(z, tokens[rows], shard, with_entropy, with_sum_pi_squared)
            log_probs[rows], lse[rows], top_log_probs[rows], expected_z[rows], sum_pi_squared[rows] = stats
            if topk:
                topk_log_probs[rows], topk_ids[rows] = _chunk_topk(z, lse[rows], topk, shard)
        # Backward recomputes each chunk's logits from these (no [tokens, vocab] tensor is kept alive).
        ctx.save_for_backward(hidden, weight, tokens, lse, expected_z)
        ctx.temperature, ctx.shard, ctx.with_entropy, ctx.reduce_hidden_grad = temperature, shard, with_entropy, reduce_hidden_grad
        entropy = lse - expected_z if with_entropy else torch.zeros_like(lse)
        ctx.mark_non_differentiable(top_log_probs, sum_pi_squared, topk_log_probs, topk_ids)
        return log_probs, entropy, top_log_probs, sum_pi_squared, topk_log_probs, topk_ids

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, *_no_grad):
        hidden, weight, tokens, lse, expected_z = ctx.saved_tensors
        shard, temperature = ctx.shard, ctx.temperature
        with_entropy = ctx.with_entropy and grad_entropy is not None
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        step = chunk_tokens(shard.local)
        scale = 1.0 / temperature if temperature not in (0.0, 1.0) else 1.0
        for s in range(0, hidden.shape[0], step):
            rows = slice(s, s + step)
            h = hidden[rows]
            z, cap_grad = shard.scaled_logits(h, weight, temperature)
            g = grad_log_probs[rows] if grad_log_probs is not None else torch.zeros_like(tokens[rows], dtype=torch.float32)
            g_entropy = grad_entropy[rows] if with_entropy else torch.zeros_like(lse[rows])
            if shard.whole:
                dz = _kernel(_chunk_grad, shard.compiled, z)(z, lse[rows], tokens[rows], g, expected_z[rows], g_entropy)
            else:
                dz = _shard_grad(z, lse[rows], tokens[rows], g, expected_z[rows], g_entropy, shard)
            dz = (dz * (scale if cap_grad is None else cap_grad * scale)).to(hidden.dtype)
            grad_hidden[rows] = dz @ weight
            grad_weight += (dz.t() @ h).float()
        # Each shard saw only its vocabulary columns: the hidden state's gradient is the sum over shards (unless the
        # caller sums it itself, e.g. a sequence-parallel gather whose backward reduce-scatters).
        if ctx.reduce_hidden_grad:
            shard.all_reduce(grad_hidden)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None, None, None


class TokenStats(NamedTuple):
    """float32 statistics of the distribution softmax(z / temperature) at each of `[tokens]` positions."""

    log_probs: torch.Tensor             # log p(token): `[tokens]`, or `[tokens, C]` for `[tokens, C]` token ids
    entropy: torch.Tensor | None        # H(p) (None unless asked)
    top_log_probs: torch.Tensor         # log p of the most likely token (no gradient)
    sum_pi_squared: torch.Tensor | None  # sum over the vocabulary of p^2 (no gradient; None unless asked): OTB's score
                                         # norm ||d log p(token) / dz||^2 = 1 - 2 p(token) + sum p^2 needs it
    topk_log_probs: torch.Tensor | None = None  # `[tokens, K]` the K largest log p, descending (no gradient; None unless topk)
    topk_ids: torch.Tensor | None = None        # `[tokens, K]` int64: their token ids


# Top-k ids travel through the model's output as float32 channels (stack_channels), exact only below 2**24.
MAX_TOPK_VOCAB = 2 ** 24


def token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = False, vocab_start: int = 0, vocab_size: int | None = None,
                    group=None, reduce_hidden_grad: bool = True, compiled: bool = False,
                    with_sum_pi_squared: bool = False, softcap: float | None = None, scale: float = 1.0,
                    topk: int = 0, suppressed: tuple[int, ...] = ()) -> TokenStats:
    """log softmax(hidden @ weight.T / temperature)[token], (optionally) the entropy of that distribution and its
    sum of squared probabilities, and the log-prob of its most likely token (`log_probs >= top` marks tokens greedy
    decoding would pick).

    hidden `[tokens, hidden]`, weight `[vocab_per_rank, hidden]` (this rank's rows `vocab_start ...` of the
    vocabulary projection; the whole of it when `group` is None), tokens `[tokens]` global ids, or `[tokens, C]`:
    C ids per position (column 0 the sampled token, the others e.g. a teacher's top ids; all in [0, vocab_size)),
    whose `[tokens, C]` log-probs under the same distribution each have a gradient. `topk` > 0: also the K largest
    log-probs `[tokens, K]` (descending) and their ids `[tokens, K]`, without gradient. Columns at or past
    `vocab_size` (TP padding) are excluded. Collective over `group` (every rank of the tensor-parallel group calls
    it with the same hidden and tokens). `reduce_hidden_grad=False` leaves hidden's gradient as this shard's partial
    sum. `compiled` (use_torch_compile): the per-chunk elementwise work runs torch.compile'd (see _VocabShard for when).
    `scale` then `softcap` (Gemma's final_logit_softcapping): the logits are softcap * tanh(scale * logits / softcap)
    before the temperature. `suppressed`: ids the rollout never samples (a vision-language model's placeholders),
    excluded from the distribution as the rollout excludes them.
    """
    vocab_size = vocab_size or vocab_start + weight.shape[0]
    if tokens.dim() not in (1, 2):
        raise ValueError(f"token_log_probs: tokens must be [tokens] or [tokens, C] ids, got shape {tuple(tokens.shape)}")
    if topk < 0 or topk > vocab_size:
        raise ValueError(f"token_log_probs: topk={topk} must be in [0, vocab_size={vocab_size}]")
    if topk and vocab_size > MAX_TOPK_VOCAB:
        raise ValueError(f"token_log_probs: topk={topk} with a vocabulary of {vocab_size} ids: the ids are stacked as float32 "
                         f"channels, exact only up to {MAX_TOPK_VOCAB}; set topk=0 for this model")
    shard = _VocabShard(vocab_start, weight.shape[0], vocab_size, group, compiled, softcap, scale, suppressed)
    columns = tokens if tokens.dim() == 2 else tokens[:, None]
    log_probs, entropy, top, sum_pi_squared, topk_log_probs, topk_ids = _TokenLogProbs.apply(
        hidden, weight, columns, temperature, with_entropy, with_sum_pi_squared, topk, shard, reduce_hidden_grad)
    return TokenStats(log_probs if tokens.dim() == 2 else log_probs[:, 0], entropy if with_entropy else None, top,
                      sum_pi_squared if with_sum_pi_squared else None, topk_log_probs if topk else None, topk_ids if topk else None)


# The scalar channels a causal-LM head stacks first along the last dim, in this order (one not asked for is zeros).
TOKEN_CHANNELS = ("log_probs", "entropy", "top_log_probs", "sum_pi_squared")


def stack_channels(stats: TokenStats, shape: torch.Size) -> torch.Tensor:
    """`[*shape, 4 + (C - 1) + 2K]` float32: the TOKEN_CHANNELS (log_probs of column 0), the log-probs of token
    columns 1 .. C-1, the K top-k log-probs, then their K ids as float32 (exact: token_log_probs refuses topk past
    MAX_TOPK_VOCAB = 2**24, the largest float32 below which every integer is exact). Concatenated, not viewed: FSDP2
    hooks the model's output, and an output that is a view defeats the hook."""
    columns = stats.log_probs.reshape(*shape, -1)
    zeros = torch.zeros_like(columns[..., 0])
    scalars = [columns[..., 0], stats.entropy, stats.top_log_probs, stats.sum_pi_squared]
    parts = [torch.stack([(t if t is not None else zeros).reshape(shape) for t in scalars], -1), columns[..., 1:]]
    if stats.topk_ids is not None:
        parts += [stats.topk_log_probs.reshape(*shape, -1), stats.topk_ids.reshape(*shape, -1).float()]
    return torch.cat(parts, -1)


def unstack_channels(out: torch.Tensor, request) -> dict[str, torch.Tensor]:
    """The named outputs of a head's `[..., channels]` stack (stack_channels) for `request`
    (rlcore.engine.base.TokenRequest): the scalar channel_names `[...]`, "gathered_log_probs" `[..., C-1]` when
    request.gather names extra token columns, "topk_log_probs" `[..., K]` and "topk_ids" (long) `[..., K]` when
    request.topk > 0. The number of extra columns is what the channel count leaves."""
    topk, gather = getattr(request, "topk", 0), getattr(request, "gather", None)
    num_gathered = out.shape[-1] - len(TOKEN_CHANNELS) - 2 * topk
    assert num_gathered >= 0 and (gather or num_gathered == 0), f"{out.shape[-1]} channels for topk={topk}, gather={gather!r}"
    named = {name: out[..., TOKEN_CHANNELS.index(name)].float() for name in channel_names(request)}
    start = len(TOKEN_CHANNELS)
    if gather:
        named["gathered_log_probs"] = out[..., start : start + num_gathered].float()
    start += num_gathered
    if topk:
        named["topk_log_probs"] = out[..., start : start + topk].float()
        # Rounded: a model that scales its head's output (rlcore.models.hf.TokenHead) returns them within float32 rounding.
        named["topk_ids"] = out[..., start + topk :].round().long()
    return named


def channel_names(request) -> tuple[str, ...]:
    """The scalar channels handed to losses and log-prob passes (rlcore.engine.base.TokenRequest): the optional ones
    only when they were computed."""
    skipped = {"entropy": not request.entropy, "sum_pi_squared": not request.sum_pi_squared}
    return tuple(name for name in TOKEN_CHANNELS if not skipped.get(name, False))
