"""Model architectures for the memory plan: read from a model directory's config.json, or a built-in table.

Only the shapes that decide memory are kept (decoder-only transformers: Qwen2/2.5, Qwen3, Llama 3/3.1/3.2,
DeepSeek-LLM, and the Qwen mixtures of experts: every layer routes each token to top_k of `experts` SwiGLU experts,
Qwen2-MoE adds a gated shared expert).
The table lets `rlcore-plan` size a 72B run on a laptop that has no weights: `model.path=~/models/Qwen2.5-72B`
resolves by name when the directory does not exist. Imports neither torch nor ray.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional

from rlcore.plan.families import is_moe, num_experts


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int
    tied_embeddings: bool
    qkv_bias: bool = False
    head_dim: Optional[int] = None  # None = hidden / heads
    qk_norm: bool = False  # Qwen3: an RMSNorm weight over one head's channels for q and for k, per layer
    experts: int = 0  # routed experts per layer (0 = a dense MLP of `intermediate`)
    top_k: int = 0  # experts each token is routed to
    moe_intermediate: int = 0  # one expert's SwiGLU width
    shared_intermediate: int = 0  # Qwen2-MoE: the shared expert's width (its gate is one more hidden-wide row)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def mlp_width(self) -> int:
        """The SwiGLU width one token passes through per layer (what its activations scale with): the dense MLP's, or
        its top_k experts' plus the shared expert's."""
        return self.top_k * self.moe_intermediate + self.shared_intermediate if self.experts else self.intermediate

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer in one decoder block: q, k, v, o, then the dense MLP's gate, up, down, or a
        MoE's shared expert and its gate (the routed experts are 3-D parameters: expert_params)."""
        h, kv, f = self.hidden, self.kv_heads * self.dim, self.intermediate
        q = self.heads * self.dim
        attention = [(h, q), (h, kv), (h, kv), (q, h)]
        if not self.experts:
            return attention + [(h, f), (h, f), (f, h)]
        s = self.shared_intermediate
        return attention + ([(h, s), (h, s), (s, h), (h, 1)] if s else [])

    def expert_params(self) -> int:
        """One layer's routed experts and its router."""
        return self.experts * (3 * self.hidden * self.moe_intermediate + self.hidden)

    def routed_params(self) -> int:
        """Every layer's routed experts (what expert parallelism splits; the routers stay whole on every rank)."""
        return self.layers * self.experts * 3 * self.hidden * self.moe_intermediate

    def layer_params(self) -> int:
        bias = (self.heads + 2 * self.kv_heads) * self.dim if self.qkv_bias else 0
        qk_norm = 2 * self.dim if self.qk_norm else 0
        linear = sum(i * o for i, o in self.linear_shapes()) + self.expert_params()
        return linear + bias + qk_norm + 2 * self.hidden  # + two RMSNorm weights

    def params(self, value_head: bool = False) -> int:
        """All parameters: embeddings, blocks, final norm and the output head (a 1-wide head for a value model)."""
        head = self.hidden if value_head else (0 if self.tied_embeddings else self.vocab * self.hidden)
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def active_layer_params(self) -> int:
        """The parameters of one block a token's forward uses (what its FLOPs scale with): all but the experts it is
        not routed to."""
        return self.layer_params() - max(self.experts - self.top_k, 0) * 3 * self.hidden * self.moe_intermediate

    def active_params(self, value_head: bool = False) -> int:
        return self.params(value_head) - self.layers * (self.layer_params() - self.active_layer_params())

    def root_params(self, value_head: bool = False) -> int:
        """Parameters outside the decoder blocks (FSDP2's root unit: embeddings, final norm, head)."""
        return self.params(value_head) - self.layers * self.layer_params()

    def lora_params(self, rank: int) -> int:
        """Trainable LoRA parameters with target_modules=all-linear: r x (in + out) per linear layer."""
        return self.layers * sum(rank * (i + o) for i, o in self.linear_shapes())

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token over all layers on one of `tp` tensor-parallel devices (KV heads split, or
        replicated when there are fewer KV heads than devices)."""
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.dim * dtype_bytes


def _qwen(name, hidden, layers, heads, kv, inter, tied, vocab=152064):
    return Arch(name, hidden, layers, heads, kv, inter, vocab, 32768, tied, qkv_bias=True)


def _qwen3(name, hidden, layers, heads, inter, tied):
    return Arch(name, hidden, layers, heads, 8, inter, 151936, 40960, tied, head_dim=128, qk_norm=True)


def _llama(name, hidden, layers, heads, kv, inter, tied=False, max_positions=8192):
    return Arch(name, hidden, layers, heads, kv, inter, 128256, max_positions, tied)


# Shapes from each model's published config.json. Qwen2 and Qwen2.5 share shapes at a given size.
BUILTIN: dict[str, Arch] = {a.name: a for a in [
    _qwen("qwen2.5-0.5b", 896, 24, 14, 2, 4864, True, vocab=151936),
    _qwen("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, True, vocab=151936),
    _qwen("qwen2.5-3b", 2048, 36, 16, 2, 11008, True, vocab=151936),
    _qwen("qwen2.5-7b", 3584, 28, 28, 4, 18944, False),
    _qwen("qwen2.5-14b", 5120, 48, 40, 8, 13824, False),
    _qwen("qwen2.5-32b", 5120, 64, 40, 8, 27648, False),
    _qwen("qwen2.5-72b", 8192, 80, 64, 8, 29568, False),
    _qwen3("qwen3-0.6b", 1024, 28, 16, 3072, True),
    _qwen3("qwen3-1.7b", 2048, 28, 16, 6144, True),
    _qwen3("qwen3-4b", 2560, 36, 32, 9728, True),
    _qwen3("qwen3-8b", 4096, 36, 32, 12288, False),
    _qwen3("qwen3-14b", 5120, 40, 40, 17408, False),
    _qwen3("qwen3-32b", 5120, 64, 64, 25600, False),
    _llama("llama3-8b", 4096, 32, 32, 8, 14336),
    _llama("llama3-70b", 8192, 80, 64, 8, 28672),
    # Llama 3.1 has Llama 3's shapes with a 128K context; 3.2's 1B and 3B tie their embeddings.
    _llama("llama3.1-8b", 4096, 32, 32, 8, 14336, max_positions=131072),
    _llama("llama3.1-70b", 8192, 80, 64, 8, 28672, max_positions=131072),
    _llama("llama3.2-1b", 2048, 16, 32, 8, 8192, tied=True, max_positions=131072),
    _llama("llama3.2-3b", 3072, 28, 24, 8, 8192, tied=True, max_positions=131072),
    Arch("deepseek-llm-7b", 4096, 30, 32, 32, 11008, 102400, 4096, False),
    # Mixtures of experts, named <total>-a<active>: 30.5B / 3.3B active, 235B / 22B, 14.3B / 2.7B, 57B / 14B.
    Arch("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 40960, False, head_dim=128, qk_norm=True, experts=128, top_k=8,
         moe_intermediate=768),
    Arch("qwen3-235b-a22b", 4096, 94, 64, 4, 12288, 151936, 40960, False, head_dim=128, qk_norm=True, experts=128, top_k=8,
         moe_intermediate=1536),
    Arch("qwen1.5-moe-a2.7b", 2048, 24, 16, 16, 5632, 151936, 8192, False, qkv_bias=True, experts=60, top_k=4,
         moe_intermediate=1408, shared_intermediate=5632),
    Arch("qwen2-57b-a14b", 3584, 28, 28, 4, 18944, 151936, 32768, False, qkv_bias=True, experts=64, top_k=8,
         moe_intermediate=2560, shared_intermediate=20480),
]}
_QWEN2_SIZES = ("0.5b", "1.5b", "7b", "72b")  # Qwen2 came in these sizes; 2.5 added 3b, 14b, 32b


def builtin_arch(name: str) -> Optional[Arch]:
    """Matches a model name or path like `Qwen/Qwen2-7B-Instruct`, `~/models/Meta-Llama-3.1-70B` or
    `deepseek-llm-7b-chat` to the table; None when nothing matches."""
    base = os.path.basename(os.path.normpath(os.path.expanduser(name))).lower()
    moe = re.search(r"(qwen[\d.]+)-(?:moe-)?(?:(\d+)b-)?a(\d+(?:\.\d+)?)b", base)
    if moe:  # Qwen3-30B-A3B, Qwen2-57B-A14B-Instruct, Qwen1.5-MoE-A2.7B-Chat
        family, total, active = moe.groups()
        return BUILTIN.get(f"{family}-{total}b-a{active}b" if total else f"{family}-moe-a{active}b")
    minor = re.search(r"llama-?3\.(\d)", base)
    base = re.sub(r"llama-?3(\.\d)?", "llama3", base)
    size = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])", base)
    if not size:
        return None
    size = size.group(1) + "b"
    if "qwen2" in base and ("qwen2.5" in base or size in _QWEN2_SIZES):
        return BUILTIN.get(f"qwen2.5-{size}")
    if "qwen3" in base:
        return BUILTIN.get(f"qwen3-{size}")
    if "llama3" in base:
        version = f"llama3.{minor.group(1)}" if minor else "llama3"
        return BUILTIN.get(f"{version}-{size}") or BUILTIN.get(f"llama3-{size}")
    if "deepseek" in base:
        return BUILTIN.get(f"deepseek-llm-{size}")
    return None


def arch_from_hf_config(config: dict, name: str) -> Arch:
    """Shapes from a raw HF config.json. The fallbacks are not rlcore defaults but what HF's model classes assume
    when a key is absent: no num_key_value_heads = plain multi-head attention, no max_position_embeddings = no
    limit to check (0), untied embeddings (Qwen2/Llama classes), q/k/v biases only on qwen2."""
    text = config.get("text_config", config)  # multimodal configs nest the language model's
    heads = text["num_attention_heads"]
    return Arch(
        name=name, hidden=text["hidden_size"], layers=text["num_hidden_layers"], heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads, intermediate=text["intermediate_size"],
        vocab=text["vocab_size"], max_positions=text.get("max_position_embeddings", 0),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(text.get("attention_bias", text.get("model_type") in ("qwen2", "qwen2_moe"))), head_dim=text.get("head_dim"),
        qk_norm=text.get("model_type") in ("qwen3", "qwen3_moe"), **_moe_shape(text))


def _moe_shape(text: dict) -> dict:
    """A MoE family's expert fields of Arch (HF's names; the shared expert is Qwen2-MoE's); none for a dense model."""
    if not is_moe(text):
        return {}
    # 0 for a key a hand-edited config.json lacks: the plan still sizes the rest, and family_problems names the model
    shared = text.get("shared_expert_intermediate_size", 0) if text["model_type"] == "qwen2_moe" else 0
    return dict(experts=num_experts(text), top_k=text.get("num_experts_per_tok", 0), moe_intermediate=text.get("moe_intermediate_size", 0),
                shared_intermediate=shared)


def hf_config(arch: Arch) -> dict:
    """A config.json for `arch` (the inverse of arch_from_hf_config): enough for transformers to build the model
    without weights, as the memory rehearsal does for a model named only by the built-in table."""
    family = "qwen3" if arch.qk_norm else ("qwen2" if arch.qkv_bias else "llama")
    if arch.experts:
        family += "_moe"
    config = dict(model_type=family, architectures=[family.title().replace("_", "") + "ForCausalLM"],
                  hidden_size=arch.hidden, num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                  num_key_value_heads=arch.kv_heads, intermediate_size=arch.intermediate, vocab_size=arch.vocab,
                  max_position_embeddings=arch.max_positions, tie_word_embeddings=arch.tied_embeddings, rms_norm_eps=1e-6)
    if arch.head_dim:
        config["head_dim"] = arch.head_dim
    if arch.experts:
        config.update(num_experts=arch.experts, num_experts_per_tok=arch.top_k, moe_intermediate_size=arch.moe_intermediate,
                      norm_topk_prob=family == "qwen3_moe")
        if arch.shared_intermediate:
            config["shared_expert_intermediate_size"] = arch.shared_intermediate
    return config


def resolve_arch(path: str) -> tuple[Optional[Arch], str]:
    """(architecture, where it came from) for a model path: its config.json if the directory has one, else the
    built-in table by name; (None, reason) when neither knows it."""
    config_file = os.path.join(os.path.expanduser(path), "config.json")
    if os.path.isfile(config_file):
        with open(config_file) as f:
            return arch_from_hf_config(json.load(f), os.path.basename(os.path.normpath(path))), config_file
    arch = builtin_arch(path)
    if arch is not None:
        return arch, f"built-in table ({arch.name}; no config.json at {path})"
    known = ", ".join(BUILTIN)
    return None, f"no config.json at {path} and the name matches no built-in architecture ({known})"
