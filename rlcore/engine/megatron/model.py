"""A megatron-core `GPTModel` for an HF checkpoint of a family megatron builds (rlcore.families: Family.megatron): the
TransformerConfig the HF config implies, the layer spec (megatron-core's local modules + SDPA core attention, DeepSeek's
latent attention; MoE layers per moe.py, dense ones where the family has them), and one model chunk per virtual stage."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as mpu
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from rlcore.config.megatron_schema import moe_override_problems
from rlcore.engine.megatron import moe
from rlcore.engine.megatron.attention import SDPACoreAttention
from rlcore.families import family_of, family_problems, megatron_rope
from rlcore.plan.megatron_layout import Layout

# verl's override_transformer_config defaults name a flash backend; rlcore picks its attention itself.
_IGNORED_OVERRIDES = ("attention_backend",)


def rope(hf_config) -> tuple[float, dict[str, Any]]:
    """(theta, GPTModel RoPE-scaling kwargs) of an HF config; refuses scalings megatron-core cannot express."""
    return megatron_rope(hf_config.to_dict())


def transformer_config(hf_config, layout: Layout, dtype: torch.dtype, device: torch.device, recompute: bool,
                       overrides: dict[str, Any]) -> TransformerConfig:
    """Every TransformerConfig field the HF architecture determines, then the role's override_transformer_config
    (verl's meaning: recompute_granularity / recompute_method / recompute_num_layers apply as given; with
    model.enable_gradient_checkpointing and none of them given, every layer is recomputed)."""
    model_type = hf_config.model_type
    problems = family_problems(hf_config.to_dict(), "megatron", tensor_parallel=layout.tp)  # the driver checked too; for direct callers
    family = family_of(hf_config.to_dict())
    problems += moe_override_problems(overrides, layout.pp, layout.ep)
    mixture = moe.moe_fields(hf_config, layout.tp, layout.sp)
    if layout.ep > 1 and not mixture:
        problems.append(f"megatron.expert_model_parallel_size={layout.ep}: {model_type} is a dense model (no experts to split); "
                        "use megatron.expert_model_parallel_size=1")
    if mixture and mixture["num_moe_experts"] % layout.ep:
        problems.append(f"megatron.expert_model_parallel_size={layout.ep} does not divide the {mixture['num_moe_experts']} experts "
                        f"of {model_type}; use a divisor of {mixture['num_moe_experts']}")
    if problems:
        raise ValueError("; ".join(problems))
    cfg = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,  # SwiGLU: linear_fc1 holds [gate; up]
        activation_func=F.silu,
        add_bias_linear=False,
        # the family's switches (rlcore.families.<family>.FAMILY.megatron); other families: config.json's own
        add_qkv_bias=family.megatron.qkv_bias or bool(getattr(hf_config, "attention_bias", False) or getattr(hf_config, "qkv_bias", False)),
        qk_layernorm=family.megatron.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=getattr(hf_config, "attention_dropout", 0.0),
        # No fused kernels: they need apex / Transformer Engine, and RL's exactness tests compare plain maths.
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, cross_entropy_loss_fusion=False,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        sequence_parallel=layout.sp,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=device.type == "cpu",
        # Nothing drawn: the HF weights fill every parameter right after (weights.load_hf). On CPU megatron-core's
        # init builds each weight whole before keeping the rank's piece, which put 0.66-0.79 of a 0.5B model on every
        # TP2 rank during its load; build_chunks sets the TP attributes its init functions would have.
        perform_initialization=False,
        # Token-budget micro-batches differ in length: pipeline stages exchange each activation's shape first
        # (megatron reads it only for that exchange; MoE's allgather dispatcher refuses it, hence not at PP=1).
        variable_seq_lengths=layout.pp > 1,
        moe_token_dispatcher_type="alltoall",  # megatron checks the dispatcher even without experts
        # Measured on gloo: interleaved 1F1B with batched p2p gave a wrong loss (6.3023 vs 6.2919) in one setup and
        # aborted a rank (SIGABRT) in the pp2_vpp2 parity test, which therefore catches it.
        batch_p2p_comm=device.type == "cuda",
    )
    cfg.update(mixture)
    if family.megatron.fields:  # the family's own (MLA's dims, DeepSeek's router) over the MoE defaults
        cfg.update(family.megatron.fields(hf_config.to_dict()))
    extra = {k: v for k, v in overrides.items() if k not in _IGNORED_OVERRIDES and v is not None}
    config_class = MLATransformerConfig if cfg.get("multi_latent_attention") else TransformerConfig
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"override_transformer_config: {unknown} are not megatron-core TransformerConfig fields")
    if extra.get("recompute_granularity") != "selective":
        extra.pop("recompute_modules", None)  # verl's default list only means something for selective recompute
    if recompute and "recompute_granularity" not in extra:
        # model.enable_gradient_checkpointing without an explicit recompute_* choice: recompute every layer.
        cfg.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    cfg.update(extra)
    return config_class(**cfg)


def without_transformer_engine() -> None:
    """megatron-core 0.16.1 without TransformerEngine (CPU, or a CUDA install without it), two names fixed so its plain
    torch paths run. Idempotent; any device.
    - The router GEMM reads `moe_utils.te_general_gemm`, bound only when TE imports: the router raised NameError
      instead of taking the plain matmul written beside it. None selects that matmul.
    - MLA believes TE is there (megatron-core's TE wrapper module imports without TE, its classes stand-ins) and
      raised TypeError on `isinstance(linear_proj, TELinear)`; it is told TE is absent."""
    import importlib.util

    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The embedding / output rows: the HF vocabulary rounded up to a multiple of TP (extra rows are masked out)."""
    return -(-vocab_size // tp) * tp


class RMSNorm(torch.nn.RMSNorm):
    """RMSNorm for megatron-core's norm slots, sequence-parallel aware (megatron-core's own torch-norm wrapper
    refuses sequence parallelism): under SP each TP rank normalises its slice of the sequence, so the weight's
    gradient is a partial sum that finalize_model_grads all-reduces for parameters marked `sequence_parallel`."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **unused) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel


class LatentRMSNorm(RMSNorm):
    """The norms of DeepSeek's query and key-value latents: HF builds them with its RMSNorm's default eps (1e-6),
    whatever config.json's rms_norm_eps says."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **unused) -> None:
        super().__init__(config, hidden_size, eps=1e-6)


def layer_spec(config: TransformerConfig, experts: bool):
    """megatron-core's local layer (column/row-parallel linears, SwiGLU MLP) with SDPA core attention and the
    RMSNorm above; its MLP slot holds megatron-core's MoELayer when `experts` (router, per-expert local MLPs
    (SequentialMLP), shared expert: its norms and linears need nothing of rlcore's)."""
    layer = get_gpt_layer_local_spec(num_experts=config.num_moe_experts if experts else None, moe_grouped_gemm=config.moe_grouped_gemm,
                                     normalization="RMSNorm", qk_layernorm=config.qk_layernorm,
                                     multi_latent_attention=config.multi_latent_attention)
    attention = layer.submodules.self_attention.submodules
    attention.core_attention = SDPACoreAttention
    if config.multi_latent_attention:  # over a whole latent (replicated on TP ranks, like Qwen3's head norms)
        attention.q_layernorm = attention.kv_layernorm = LatentRMSNorm
    elif config.qk_layernorm:  # over one head's channels; replicated on TP ranks, whose grads megatron-core sums by name
        attention.q_layernorm = attention.k_layernorm = RMSNorm
    layer.submodules.input_layernorm = RMSNorm
    layer.submodules.pre_mlp_layernorm = RMSNorm
    return layer


def block_spec(config: TransformerConfig, vp_stage: int | None) -> TransformerBlockSubmodules:
    """The layers of this pipeline (virtual) stage: MoE layers where the model routes, dense ones elsewhere
    (DeepSeek-V3's first layers)."""
    first = get_transformer_layer_offset(config, vp_stage)
    routing = moe.moe_columns(config)
    specs = {experts: layer_spec(config, experts) for experts in (False, True)}
    return TransformerBlockSubmodules(layer_specs=[specs[first + i in routing] for i in range(get_num_layers_to_build(config, vp_stage))],
                                      layer_norm=RMSNorm)


class ValueHead(torch.nn.Module):
    """A critic's scalar head on the last stage, in place of the vocabulary projection: HF's token-classification
    `score` (hidden -> 1, no bias), replicated on every TP rank (its input, the final hidden state, is too)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, hidden_size, dtype=dtype))

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        return hidden @ self.weight.t(), None


def build_chunks(hf_config, config: TransformerConfig, kind: str, device: torch.device) -> list[GPTModel]:
    """One GPTModel per virtual pipeline stage of this rank (one without interleaving)."""
    theta, scaling = rope(hf_config) if not config.multi_latent_attention else (0.0, {})  # MLA: its own RoPE (config)
    tied = kind == "causal_lm" and bool(getattr(hf_config, "tie_word_embeddings", False))
    chunks = []
    for vp_stage in range(config.virtual_pipeline_model_parallel_size or 1):
        stage = vp_stage if config.virtual_pipeline_model_parallel_size else None
        model = GPTModel(
            config=config, transformer_layer_spec=block_spec(config, stage),
            vocab_size=padded_vocab_size(hf_config.vocab_size, config.tensor_model_parallel_size),
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=tied, position_embedding_type="rope",
            rotary_base=theta, parallel_output=True, vp_stage=stage, **scaling,
        )
        if kind == "value" and model.post_process:
            model.output_layer = ValueHead(config.hidden_size, config.params_dtype)
        mark_tensor_parallel(model)
        chunks.append(model.to(device))
    return chunks


def mark_tensor_parallel(model: torch.nn.Module) -> None:
    """The attributes megatron-core's init functions set on a TP-split weight (grad-norm and the optimizer count a
    split weight on every TP rank, a replicated one once): column-parallel layers and the vocabulary split dim 0,
    row-parallel ones dim 1; a gated MLP's fc1 (dense, shared expert or routed expert) holds [gate; up] per rank,
    stride 2 (megatron-core's MLP passes it).
    Biases and the rest get theirs at construction. tests/engine/test_megatron_features.py compares them with
    megatron-core's own."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, set_tensor_model_parallel_attributes

    gated = model.config.gated_linear_unit
    for name, module in model.named_modules():
        dim = 0 if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)) else 1 if isinstance(module, RowParallelLinear) else None
        weight = getattr(module, "weight", None) if dim is not None else None
        if weight is not None and not hasattr(weight, "tensor_model_parallel"):  # perform_initialization=True set them
            stride = 2 if gated and name.endswith("linear_fc1") else 1
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=dim, stride=stride)
