"""The architecture facts the memory plan reads, for any decoder-only model: its blocks by kind, each with its
parameters, its routed experts and what it caches per token (or per sequence), so a model whose layers differ
(DeepSeek-V3's dense first layers, Gemma's sliding and global layers, Qwen3.5's linear-attention layers) is counted
exactly. A family module (rlcore.families.<family>) builds an `Arch` from its config.json; tests/families checks
every count against the parameters transformers builds for the same config. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Linear = tuple[int, int]  # (in_features, out_features) of one 2-D projection


@dataclass(frozen=True)
class Block:
    """One kind of decoder block and how many of it the model has."""

    count: int
    linears: tuple[Linear, ...]  # its 2-D projections outside the routed experts (LoRA's all-linear targets)
    other: int = 0               # its other parameters: norms, biases, attention sinks, a router, a conv kernel
    experts: int = 0             # routed experts
    expert_params: int = 0       # one routed expert's parameters (its biases included)
    top_k: int = 0               # experts each token goes through
    kv_heads: int = 0            # heads cached per token (MLA: 1, its latent; 0: a recurrent layer caches no tokens)
    kv_dims: int = 0             # channels cached per head and token, K and V together
    window: int = 0              # sliding-window attention: a windowed cache keeps this many tokens (0: all of them)
    state: int = 0               # a recurrent layer's state per sequence (elements), whatever its length

    @property
    def params(self) -> int:
        return sum(i * o for i, o in self.linears) + self.other + self.experts * self.expert_params

    @property
    def active_params(self) -> int:
        """What one token's forward through the block uses: all but the experts it is not routed to."""
        return self.params - max(self.experts - self.top_k, 0) * self.expert_params


@dataclass(frozen=True)
class Arch:
    """A decoder-only model as the memory plan sees it."""

    name: str
    model_type: str
    hidden: int
    heads: int
    kv_heads: int                # K/V heads a training forward computes (MLA expands its latent to every head)
    head_dim: int
    vocab: int
    max_positions: int           # 0: no limit to check
    tied_embeddings: bool
    blocks: tuple[Block, ...]
    mlp_width: int               # the SwiGLU width one token passes through per block (its activations scale with it)
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # the config.json it describes
    estimated: str = ""          # why the counts are an estimate (a model_type without a family module), or ""
    tower: int = 0               # a vision-language model's vision tower parameters (rlcore.families.vision)
    vision: Any = None           # and its TowerShape (what its activations scale with); None: text-only

    @property
    def layers(self) -> int:
        return sum(b.count for b in self.blocks)

    @property
    def dim(self) -> int:
        return self.head_dim

    @property
    def experts(self) -> int:
        return max(b.experts for b in self.blocks)

    @property
    def top_k(self) -> int:
        return max(b.top_k for b in self.blocks)

    def layer_params(self) -> int:
        """The largest block's parameters (what FSDP2 gathers for one unit)."""
        return max(b.params for b in self.blocks)

    def blocks_params(self) -> int:
        return sum(b.count * b.params for b in self.blocks)

    def root_params(self, value_head: bool = False) -> int:
        """Parameters outside the decoder blocks (FSDP2's root unit): embeddings, final norm, output head (a 1-wide
        head for a value model)."""
        head = self.hidden if value_head else (0 if self.tied_embeddings else self.vocab * self.hidden)
        return self.vocab * self.hidden + self.hidden + head

    def params(self, value_head: bool = False) -> int:
        return self.root_params(value_head) + self.blocks_params() + self.tower

    def active_blocks_params(self) -> int:
        """The decoder blocks' parameters one token's forward uses (what their FLOPs scale with)."""
        return sum(b.count * b.active_params for b in self.blocks)

    def active_params(self, value_head: bool = False) -> int:
        return self.root_params(value_head) + self.active_blocks_params()

    def routed_params(self) -> int:
        """Every block's routed experts (what expert parallelism splits; routers stay whole on every rank)."""
        return sum(b.count * b.experts * b.expert_params for b in self.blocks)

    def lora_params(self, rank: int) -> int:
        """Trainable LoRA parameters with target_modules=all-linear: r x (in + out) per 2-D projection."""
        return sum(b.count * rank * (i + o) for b in self.blocks for i, o in b.linears)

    def kv_bytes(self, tokens: int, dtype_bytes: int, tp: int = 1, windowed: bool = True) -> int:
        """K/V cache (and recurrent state) of one sequence of `tokens` tokens on one of `tp` tensor-parallel
        devices: cached heads split over TP, or replicated when there are fewer than devices (MLA's one latent
        is on every device). `windowed`: a sliding-window layer keeps only its window (vLLM); the native engine
        keeps every position."""
        total = 0
        for b in self.blocks:
            kept = min(tokens, b.window) if windowed and b.window else tokens
            cached = max(1, b.kv_heads // tp) * b.kv_dims * kept if b.kv_heads else 0
            total += b.count * (cached + b.state // tp)  # a recurrent state splits over TP by its heads
        return total * dtype_bytes

    def cache_summary(self) -> str:
        """What each kind of layer caches, for the plan's notes: "24 full-attention layers x 2 x 8 heads x 128", a
        window, MLA's latent, a recurrent state."""
        counts: dict[str, int] = {}
        for b in self.blocks:
            if b.state:
                kind = f"linear-attention layers with a {b.state:,}-element state per sequence"
            elif b.kv_heads == 1 and self.kv_heads > 1:
                kind = f"latent-attention layers caching {b.kv_dims} channels per token"
            else:
                window = f"sliding-window ({b.window} tokens)" if b.window else "full-attention"
                kind = f"{window} layers caching {b.kv_heads} KV heads x {b.kv_dims} per token"
            counts[kind] = counts.get(kind, 0) + b.count
        return "; ".join(f"{count} {kind}" for kind, count in counts.items())

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token over every attention layer (a window not applied, recurrent state not counted)."""
        return sum(b.count * max(1, b.kv_heads // tp) * b.kv_dims for b in self.blocks if b.kv_heads) * dtype_bytes


# ---------------------------------------------------------------------------------------------------- builders
def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (multimodal configs nest it as text_config)."""
    return config.get("text_config") or config


def head_dim(c: dict[str, Any]) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def kv_head_count(c: dict[str, Any]) -> int:
    """HF's default when the key is absent: plain multi-head attention."""
    return c.get("num_key_value_heads") or c["num_attention_heads"]


def gqa_linears(c: dict[str, Any], q_factor: int = 1) -> tuple[Linear, ...]:
    """q, k, v, o of grouped-query attention (`q_factor` 2: q_proj also computes an output gate per head)."""
    h, d, heads, kv = c["hidden_size"], head_dim(c), c["num_attention_heads"], kv_head_count(c)
    return (h, heads * d * q_factor), (h, kv * d), (h, kv * d), (heads * d, h)


def swiglu(hidden: int, width: int) -> tuple[Linear, ...]:
    """gate, up, down of a SwiGLU MLP."""
    return (hidden, width), (hidden, width), (width, hidden)


def qkv_bias(c: dict[str, Any], out: bool) -> int:
    """q/k/v biases, and o's when `out`."""
    d, heads, kv = head_dim(c), c["num_attention_heads"], kv_head_count(c)
    return (heads + 2 * kv) * d + (c["hidden_size"] if out else 0)


def layer_kinds(c: dict[str, Any]) -> list[str]:
    """Each layer's attention kind from `layer_types` (full_attention, sliding_attention, linear_attention, ...);
    every layer full attention when the config has no such list."""
    return list(c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"])


def attention_blocks(c: dict[str, Any], linears: tuple[Linear, ...], other: int, kv_dims: int | None = None,
                     **mlp: Any) -> list[Block]:
    """The blocks of a model whose layers differ only in their attention window (`layer_types`, or a global
    `sliding_window` with `use_sliding_window` where the family has that switch): one Block per window size."""
    kinds = layer_kinds(c)
    window = c.get("sliding_window") or 0
    if "use_sliding_window" in c and not c["use_sliding_window"]:
        window = 0
    kv_dims = kv_dims if kv_dims is not None else 2 * head_dim(c)
    sliding = sum(k == "sliding_attention" for k in kinds) if c.get("layer_types") else (len(kinds) if window else 0)
    blocks = []
    for count, w in ((len(kinds) - sliding, 0), (sliding, window)):
        if count:
            blocks.append(Block(count, linears, other, kv_heads=kv_head_count(c), kv_dims=kv_dims, window=w, **mlp))
    return blocks


def arch(c: dict[str, Any], name: str, blocks: list[Block], mlp_width: int, kv_heads: int | None = None,
         tied_default: bool = False, estimated: str = "") -> Arch:
    """An Arch over a text config's common keys."""
    text = text_config(c)
    return Arch(name=name, model_type=text.get("model_type", ""), hidden=text["hidden_size"], heads=text["num_attention_heads"],
                kv_heads=kv_heads or kv_head_count(text), head_dim=head_dim(text), vocab=text["vocab_size"],
                max_positions=text.get("max_position_embeddings") or 0,
                tied_embeddings=bool(c.get("tie_word_embeddings", text.get("tie_word_embeddings", tied_default))),
                blocks=tuple(blocks), mlp_width=mlp_width, config=c, estimated=estimated)


def dense_arch(c: dict[str, Any], name: str, *, attention_other: int = 0, norms: int = 2, q_factor: int = 1,
               mlp_bias: bool = False, tied_default: bool = False, estimated: str = "") -> Arch:
    """A dense decoder of grouped-query attention and SwiGLU (Llama's block), with what a family adds to it:
    `attention_other` (biases, q/k norms, sinks), `norms` hidden-wide norm weights per block."""
    text = text_config(c)
    h, f = text["hidden_size"], text["intermediate_size"]
    other = attention_other + norms * h + ((2 * f + h) if mlp_bias else 0)
    blocks = attention_blocks(text, gqa_linears(text, q_factor) + swiglu(h, f), other)
    return arch(c, name, blocks, f, tied_default=tied_default, estimated=estimated)


MOE_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")


def routed_experts(c: dict[str, Any]) -> int:
    """Routed experts per MoE layer, under whichever name the config uses (transformers 5 writes
    `num_local_experts`, Qwen's checkpoints `num_experts`, DeepSeek's `n_routed_experts`); 0 for a dense model."""
    return next((c[k] for k in MOE_KEYS if c.get(k)), 0)


def moe_block(c: dict[str, Any], count: int, attention: tuple[Linear, ...], other: int, *, shared: tuple[Linear, ...] = (),
              expert_params: int | None = None, router: int | None = None, **kv: Any) -> Block:
    """`count` MoE blocks: attention, optional shared expert(s), a router (`router` parameters, default one
    hidden-wide row per expert) and routed SwiGLU experts of moe_intermediate_size."""
    h, experts = c["hidden_size"], routed_experts(c)
    router = experts * h if router is None else router
    expert_params = 3 * h * c["moe_intermediate_size"] if expert_params is None else expert_params
    return Block(count, attention + shared, other + router, experts=experts, expert_params=expert_params,
                 top_k=c["num_experts_per_tok"], **kv)
