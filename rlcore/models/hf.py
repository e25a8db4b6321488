"""Loading HF causal LMs from local directories (no hub access is ever attempted)."""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer, PretrainedConfig

from rlcore.families.vision import placeholder_token_ids
from rlcore.models.logits import stack_channels, token_log_probs
from rlcore.models.tower_attention import use_tower_attention
from rlcore.models.varlen import padded_attention

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def to_torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def quiet_transformers() -> None:
    """Worker processes: one "Loading weights" bar per engine per rank is noise; errors still show."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def resolve_model_path(path: str, config_key: str = "actor_rollout_ref.model.path") -> str:
    """Expands `~` and checks the directory exists, with a message that says which key to fix."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(os.path.join(full, "config.json")):
        raise FileNotFoundError(
            f"{config_key}={path!r}: no config.json in {full}. rlcore loads models from local "
            "directories only (HF save_pretrained layout); for the tiny demo run `make train` to build it."
        )
    return full


class ModelLoadError(ValueError):
    """A model or tokenizer directory the config names that exists but does not load; the message names the key.
    Raised in the workers, it reaches the driver as the cause of Ray's task error (rlcore.train says it in one line)."""


@contextlib.contextmanager
def named_load(key: str, path: str, what: str = "the model"):
    """Loading errors from inside transformers / safetensors (a truncated shard, a config.json of another
    version, a tokenizer file that is not one) become one line naming the config key that points at them."""
    try:
        yield
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        reason = " ".join(str(err).split())[:500]
        raise ModelLoadError(f"{key}={path}: {what} does not load: {type(err).__name__}: {reason}") from err


def import_external_lib(module: str | None, key: str) -> None:
    """verl's `*.model.external_lib`: imports `module` (a dotted name on sys.path) for its side effects, typically
    registering a custom architecture with AutoConfig / AutoModel, before anything loads. Called in the controller
    and in every worker process (each is its own interpreter)."""
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ModelLoadError(f"{key}={module}: the module does not import ({type(err).__name__}: {err}); "
                             "put its package on PYTHONPATH of the controller and the workers, or unset the key") from err


def load_tokenizer(path: str, trust_remote_code: bool = False, chat_template: str | None = None):
    """The HF tokenizer in the local directory `path`. `trust_remote_code` (`*.trust_remote_code`) lets a tokenizer
    class shipped in that directory run; `chat_template` (`actor_rollout_ref.model.custom_chat_template`) replaces
    the tokenizer's Jinja template, so every apply_chat_template (dataset, multi-turn rollout) renders with it."""
    tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(path), local_files_only=True, trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def policy_tokenizer(model_cfg, trust_remote_code: bool):
    """The policy's tokenizer as `actor_rollout_ref.model` describes it (tokenizer_path or path, custom template).
    `trust_remote_code`: data.trust_remote_code in the controller, model.trust_remote_code in workers (as verl)."""
    return load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, trust_remote_code, model_cfg.custom_chat_template)


def load_config(path: str, override_config: dict[str, Any] | None = None, trust_remote_code: bool = False,
                hf_config_path: str | None = None) -> PretrainedConfig:
    """The HF config of the model at `path`, read from `hf_config_path` instead when set
    (actor_rollout_ref.model.hf_config_path: weights from path, architecture from there), then overridden."""
    source = resolve_model_path(hf_config_path, "actor_rollout_ref.model.hf_config_path") if hf_config_path else resolve_model_path(path)
    config = AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        if not hasattr(config, key):
            raise ValueError(f"actor_rollout_ref.model.override_config.{key}: {type(config).__name__} has no field {key!r}")
        setattr(config, key, value)
    return config


def load_causal_lm(path: str, override_config: dict[str, Any] | None = None, dtype: torch.dtype = torch.float32, weights: bool = True,
                   attn_implementation: str | None = None, trust_remote_code: bool = False, hf_config_path: str | None = None) -> torch.nn.Module:
    """The model at `path` in `dtype`; `weights=False` builds the architecture only (weights arrive by sync).
    `attn_implementation`: see rlcore.models.varlen.attention_implementation (None: the model's own, sdpa or eager).
    `trust_remote_code`, `hf_config_path`: see load_config (custom modeling code in the directory runs only when trusted)."""
    config = load_config(path, override_config, trust_remote_code, hf_config_path)
    attn_implementation = attn_implementation or padded_attention(config)
    auto = AutoModelForCausalLM
    if getattr(config, "vision_config", None) is not None:  # a vision-language model: tower + language model + head
        from transformers import AutoModelForImageTextToText as auto
    model = _load(auto, config, path, dtype, weights, attn_implementation, trust_remote_code)
    if getattr(config, "vision_config", None) is not None:  # its tower attends once per block, not once per window
        use_tower_attention(model)
    return model


def _load(auto, config, path: str, dtype: torch.dtype, weights: bool, attn_implementation: str, trust_remote_code: bool) -> torch.nn.Module:
    if weights:
        model, info = auto.from_pretrained(resolve_model_path(path), config=config, dtype=dtype, local_files_only=True,
                                                           attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
                                                           output_loading_info=True)
        if info["missing_keys"]:  # transformers would train them from random values, with a warning at most
            missing = sorted(info["missing_keys"])
            raise KeyError(f"the checkpoint has no tensor for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        return model
    return auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code)


def load_value_model(path: str, override_config: dict[str, Any] | None = None, dtype: torch.dtype = torch.float32,
                     weights: bool = True, attn_implementation: str | None = None, trust_remote_code: bool = False,
                     hf_config_path: str | None = None) -> torch.nn.Module:
    """A critic: the LM trunk at `path` with a scalar head `score` [hidden -> 1] on every position.

    The head is HF's token-classification `score` with no bias and no dropout, i.e. exactly the head of an HF
    reward model (`*ForSequenceClassification`, num_labels=1): pointing `path` at a reward model loads trunk AND
    head (OpenRLHF's critic init); pointing it at a causal LM loads the trunk and initialises the head.
    """
    config = load_config(path, override_config, trust_remote_code, hf_config_path)
    attn_implementation = attn_implementation or padded_attention(config)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # dropout on the value head only adds noise to regression targets
    config.token_classification_bias = False
    if not weights:  # the architecture only (a sharded load fills it: rlcore.engine.sharded_load)
        return AutoModelForTokenClassification.from_config(config, dtype=dtype, attn_implementation=attn_implementation,
                                                           trust_remote_code=trust_remote_code)
    return AutoModelForTokenClassification.from_pretrained(resolve_model_path(path), config=config, dtype=dtype, local_files_only=True,
                                                           attn_implementation=attn_implementation, trust_remote_code=trust_remote_code)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated transformer blocks of a HF causal LM (the unit FSDP shards and checkpointing wraps)."""
    for path in ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers"):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"don't know where the decoder blocks of {type(model).__name__} are; add its path to rlcore.models.hf.decoder_layers")


def tied_weight_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another parameter under a second name (a tied `lm_head.weight` is the
    embedding): streamed once, under the first name, by every weight sync and export. HF (and vLLM) re-tie on load."""
    seen: set[int] = set()
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied


class TokenHead:
    """Makes an HF causal LM's `lm_head` compute per-token log-probs (and entropy) of given tokens instead of
    logits, inside the model's own forward (so FSDP2 has the head's weight gathered exactly when it is used).

    Within `head.computing(tokens, request)`, the model's `.logits` are `[batch, k, channels]`
    (rlcore.models.logits.stack_channels; unstack_channels names them) of `tokens` `[batch, k]`, or `[batch, k, C]`
    (C ids per position), at the positions selected by `logits_to_keep`; outside it the head is a plain linear.

    Some families change the head's output in their forward: Gemma soft-caps it (`final_logit_softcapping`, switched
    off while the head returns channels: the head caps the logits itself), Cohere, Granite and Falcon-H1 scale it
    (`logit_scale`, `logits_scaling`, `lm_head_multiplier`: the head computes with the scale and returns its channels
    divided by it, which the model's own multiply undoes). `calibrate` reads the scale off the model's forward; a
    change it cannot reproduce is refused rather than trained on.
    """

    def __init__(self, model: torch.nn.Module, compiled: bool = False) -> None:
        self.compiled = compiled  # use_torch_compile: rlcore.models.logits compiles the head's chunk kernels
        self.linear = model.get_output_embeddings()
        if getattr(self.linear, "bias", None) is not None:
            raise ValueError(f"{type(model).__name__}'s output layer has a bias; rlcore's log-prob head supports none")
        self.vocab_size = model.config.get_text_config().vocab_size
        self.config = model.config
        # Gemma's final_logit_softcapping: HF caps whatever its head returns, so while the head returns log-prob
        # channels the model's cap is off and the head caps the logits itself.
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.scale = 1.0  # what the model's forward multiplies the head's output by (calibrate)
        self.scale_exact = True  # that scale is a config value the forward multiplies by, not a fit (calibrate)
        # A vision-language model's image / video placeholders: the rollout never samples them (a sampled one would be
        # taken for an image the row does not have), so they are out of the distribution here too.
        self.suppressed = placeholder_token_ids(model.config)
        self._pending = None
        self.linear.forward = self._forward

    @torch.no_grad()
    def calibrate(self, model: torch.nn.Module, device: torch.device) -> None:
        """One forward of a few tokens (collective under FSDP2: every rank runs it): compares the model's logits with
        what its output layer returned. Equal, or soft-capped as configured: nothing to do. A fixed multiple: that is
        the scale, taken exactly from the config value it equals (the forward may run in bf16). Anything else raises."""
        outputs = []
        hook = self.linear.register_forward_hook(lambda module, args, out: outputs.append(out.float()))
        try:
            ids = (torch.arange(8, device=device) * 7 % self.vocab_size)[None]
            logits = model(input_ids=ids, use_cache=False).logits.float()
        finally:
            hook.remove()
        if is_fake(logits):  # the memory rehearsal: no values to compare
            return
        z = outputs[-1]
        expected = torch.tanh(z / self.softcap) * self.softcap if self.softcap is not None else z
        tolerance = 1e-2 * float(expected.abs().max()) + 1e-6  # a bf16 forward's rounding
        if float((logits - expected).abs().max()) <= tolerance:
            return
        fitted = float((logits * z).sum() / (z * z).sum())
        if self.softcap is None and float((logits - fitted * z).abs().max()) <= 1e-2 * float(logits.abs().max()) + 1e-6:
            near = _config_value_near(self.config, fitted)
            self.scale, self.scale_exact = (fitted, False) if near is None else (near, True)
            return
        raise ValueError(f"{self.config.model_type}: its forward changes the output layer's logits in a way rlcore's log-prob head "
                         f"cannot reproduce (max difference {float((logits - expected).abs().max()):.3g}); rlcore would train on "
                         "wrong log-probs. Please report the model type")

    @contextlib.contextmanager
    def computing(self, tokens: torch.Tensor, request):
        """`request`: rlcore.engine.base.TokenRequest (its temperature and which optional channels to compute)."""
        self._pending = (tokens, request)
        if self.softcap is not None:
            self.config.final_logit_softcapping = None
        try:
            yield
        finally:
            self._pending = None
            if self.softcap is not None:
                self.config.final_logit_softcapping = self.softcap

    def _forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._pending is None:
            return torch.nn.functional.linear(hidden, self.linear.weight)
        tokens, request = self._pending
        topk = getattr(request, "topk", 0)
        if topk and self.scale != 1.0:
            self._check_ids_survive_the_scale()
        flat = tokens.reshape(-1) if tokens.shape == hidden.shape[:-1] else tokens.reshape(-1, tokens.shape[-1])
        stats = token_log_probs(hidden.reshape(-1, hidden.shape[-1]), self.linear.weight, flat, request.temperature,
                                request.entropy, vocab_size=self.vocab_size, compiled=self.compiled,
                                with_sum_pi_squared=request.sum_pi_squared, softcap=self.softcap, scale=self.scale, topk=topk,
                                suppressed=self.suppressed)
        channels = stack_channels(stats, hidden.shape[:-1])
        # The model multiplies its head's output back, the top-k id channels too: they return within a few float32
        # roundings of the id (unstack_channels rounds them), see _check_ids_survive_the_scale.
        return channels if self.scale == 1.0 else channels / self.scale

    def _check_ids_survive_the_scale(self) -> None:
        """Top-k ids divided by the scale here and multiplied back by the model are off by at most ~4 float32
        roundings, id * 4 * 2**-24: under 0.5, so rounding restores them, for ids below 2**21. A fitted scale (no
        config value matched) differs from the model's by up to the fit's error, which no rounding undoes."""
        if not self.scale_exact or self.vocab_size > 2 ** 21:
            raise ValueError(f"{self.config.model_type}: top-k log-probs (topk > 0) are not supported for a model whose forward "
                             f"scales the output layer's logits (scale {self.scale:.6g}, "
                             f"{'from the config' if self.scale_exact else 'fitted, no config value matched'}; vocab_size "
                             f"{self.vocab_size}): the token ids would not survive the scale exactly. Set topk=0 for this model")


def _config_value_near(config, fitted: float) -> float | None:
    """The config value (or its reciprocal: Granite divides by `logits_scaling`) a fitted logit scale equals within
    1%, so a bf16 probe does not leave its rounding in every log-prob; None when none does."""
    for value in config.to_dict().values():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            for candidate in (float(value), 1.0 / float(value)):
                if abs(candidate - fitted) <= 1e-2 * abs(fitted):
                    return candidate
    return None
