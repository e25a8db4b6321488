"""Keys accepted so that verl command lines compose, but with no effect in rlcore: each with the reason.

A key that is accepted and does nothing is worse than a refusal: the user who sets it expects its effect and blames
the run for what follows. So every key of the schemas is one of three kinds, and tests/config/test_key_status.py
walks every leaf to keep it that way:
- wired: code reads it and a behaviour test shows its effect (the registry tests/config/wired_keys.txt);
- refused: validation refuses a value other than the default, naming the key and what to use (REFUSED below lists
  one such value per key, which the test composes);
- no effect (NO_EFFECT below): the value is accepted, and a value other than the default is reported, with the
  reason, first in rlcore-plan's report and once at the start of every run.

Keys are fnmatch patterns over full keys ("*" spans sections), matched against the PPO, SFT and reward-model
trainers' schemas alike (`*.fsdp_config.forward_prefetch` covers every role's).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import typing
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

# pattern -> why the key changes nothing in rlcore (and what rlcore does instead)
NO_EFFECT: dict[str, str] = {
    "data.tokenizer": "rlcore tokenizes the prompts with the policy's tokenizer (actor_rollout_ref.model.tokenizer_path, "
                      "else its path): the prompt ids must be the ids the policy reads",
    "data.dataloader_num_workers": "rlcore tokenizes every prompt once at start and a batch only pads in-memory lists, so "
                                   "there is no per-batch work for loader processes to overlap",
    "data.filter_overlong_prompts_workers": "rlcore measures every prompt in one batched call of the fast tokenizer, which "
                                            "already runs in parallel",
    "data.return_raw_input_ids": "a reward model with another tokenizer re-renders each conversation from raw_prompt in "
                                 "its own chat template (verl reads this key nowhere either)",
    "data.use_shm": "rlcore reads each parquet file once, into memory, when the run starts",
    "data.image_patch_size": "the processor saved beside a vision-language model sets its patch size "
                             "(preprocessor_config.json), which its vision tower was trained with",
    "*model.use_shm": "rlcore loads local model directories, whose safetensors shards the OS page cache already serves "
                      "from memory on repeated reads; a /dev/shm copy would duplicate that memory",
    "*optim.total_training_steps": "the schedule's length is the run's (trainer.total_training_steps, else epochs x "
                                    "steps per epoch), filled in at start as verl does",
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": "the reference is frozen: it has no optimizer state",
    "actor_rollout_ref.ref.megatron.grad_offload": "the reference is frozen: it has no gradients",
    "actor_rollout_ref.ref.megatron.optimizer_offload": "the reference is frozen: it has no optimizer state",
    "actor_rollout_ref.ref.megatron.use_distributed_optimizer": "the reference is frozen: it has no optimizer",
    "actor_rollout_ref.ref.megatron.override_ddp_config": "the reference is frozen: megatron-core's DDP wrapper (gradient "
                                                          "buckets) is never built for it",
    "critic.megatron.router_replay.*": "the critic's forwards never replay routes (router replay is the policy's: "
                                       "actor_rollout_ref.actor.router_replay.mode)",
    "*.megatron.dist_checkpointing_path": "it is read only with use_dist_checkpointing=True, which is refused (rlcore reads "
                                          "the HF checkpoint at model.path)",
    "actor_rollout_ref.rollout.mode": "rlcore has one rollout path, the in-process engine driven by the agent loop, which "
                                      "serves both of verl's modes",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": "the naive backend, the only one, takes no options",
    "actor_rollout_ref.rollout.agent.custom_async_server.name": "it names the class in custom_async_server.path, which is "
                                                                "refused (no custom rollout servers)",
    "*.fsdp*.strategy": "rlcore trains every FSDP role with FSDP2, whichever version is named here (as "
                              "<role>.strategy=fsdp does); fsdp and fsdp2 are accepted",
    "*use_orig_params": "FSDP2 always shards the original parameters (FSDP1's flat parameters do not exist "
                                     "there)",
    "*.use_fused_kernels": "rlcore always computes log-probs and entropy from the hidden states a chunk of tokens at a "
                           "time, without [tokens, vocab] logits (rlcore/models/logits.py), which is what verl's fused "
                           "kernels are for",
    # bench/log_prob_head.py: 8192 tokens x vocab 151936, the whole logits' peak 27.6 GiB, rlcore's chunked head's 1.2
    "*entropy_from_logits_with_chunking": "rlcore always computes the entropy a chunk of tokens at "
                                                             "a time, never the whole [tokens, vocab] logits "
                                                             "(rlcore/models/logits.py)",
    "*entropy_checkpointing": "rlcore's backward always recomputes each chunk's logits instead of "
                                                 "keeping them (rlcore/models/logits.py); the reference has no backward",
    "actor_rollout_ref.model.lora.dtype": "rlcore's Megatron adapters are stored in the model's params dtype and trained "
                                          "through megatron-core's fp32 main copy",
    "actor_rollout_ref.model.lora.a2a_experimental": "rlcore's adapters use megatron-core's TP collectives (no "
                                                     "Megatron-Bridge all-to-all)",
    "actor_rollout_ref.model.lora.dropout_position": "rlcore's Megatron LoRA has no dropout (model.lora.dropout=0), so "
                                                     "there is no position to choose",
    "*mixed_precision.buffer_dtype": "FSDP2 (verl's fsdp2 and rlcore) keeps buffers in the dtype they were "
                                                  "loaded in; only FSDP1 casts them",
    "data.pad_mode": "verl's SFT collator layout (no_padding: nested tensors, right: padded to max_length); rlcore's SFT "
                     "batches rows unpadded and its engine packs them or pads each micro-batch as use_remove_padding "
                     "says, with the same loss either way",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "rlcore computes sum_pi_squared in the old-log-prob pass, "
                                                            "which has no backward, a chunk of tokens at a time from "
                                                            "the hidden states (rlcore/models/logits.py)",
    "*.fused_kernel_options.impl_backend": "it picks the backend of verl's fused kernels (use_fused_kernels), whose work "
                                           "rlcore's chunked log-prob head does (rlcore/models/logits.py)",
    "*model.use_liger": "Liger's kernels are not used: the memory its fused linear cross-entropy saves, rlcore's chunked "
                        "log-prob and loss head saves too (no [tokens, vocab] logits, rlcore/models/logits.py); its "
                        "fused RMSNorm / SwiGLU / RoPE kernels are a speed-up rlcore does not have",
    "*.megatron.use_mbridge": "rlcore converts HF <-> megatron-core weights with its own converter for the families it "
                              "supports (rlcore/engine/megatron/weights.py)",
    "*.megatron.vanilla_mbridge": "rlcore converts HF <-> megatron-core weights with its own converter (no mbridge)",
    "actor_rollout_ref.rollout.layered_summon": "rlcore's weight sync always gathers the training weights a bucket at a "
                                                "time (checkpoint_engine.update_weights_bucket_megabytes), never the "
                                                "whole model at once",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "rlcore's hybrid engine always wakes in stages: the rollout's "
                                                     "weights, the weight sync, the actor's parameters offloaded, then "
                                                     "the KV cache (rlcore/rollout/weight_sync.py)",
    "actor_rollout_ref.rollout.calculate_log_probs": "rlcore's rollouts always return their log-probs (rollout_log_probs; "
                                                     "the rollout_corr/* mismatch metrics are logged every step)",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "rlcore's tool agent appends each turn's tokens "
                                                                        "to the sample and never re-renders the "
                                                                        "conversation with the chat template",
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "rlcore's tool agent never re-tokenizes a "
                                                                           "conversation (token ids in, token ids out), "
                                                                           "so there is no tokenization to check",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "verl's SGLang-era key for repeating interaction "
                                                                "rollouts; rlcore repeats every prompt rollout.n times, "
                                                                "interactions or not",
    "reward.reward_model.rollout.*": "they configure the inference engine verl's reward loop serves the reward model with; "
                              "rlcore runs the same forward (the last token's score, as vLLM's classify endpoint "
                              "returns it) in its reward-model worker group, batched by reward_model."
                              "forward_max_token_len_per_gpu",
    "reward.num_workers": "it counts verl's reward-loop workers, which send samples to the reward model's "
                                "server; rlcore hands the batch to its reward-model worker group directly (rule "
                                "scorers run in reward_model.score_workers processes)",
    "reward_model.launch_reward_fn_async": "not implemented: rlcore scores right after generation, in "
                                           "reward_model.score_workers processes, before the log-prob passes "
                                           "(timing_s/reward shows what it costs)",
    "*.profiler.tool_config.npu.*": "Ascend NPU profiling: global_profiler.tool=npu is refused (rlcore does not run on "
                                    "Ascend NPUs)",
    "global_profiler.global_tool_config.nsys.controller_nsight_options": "rlcore runs its workers under Nsight "
                                                                         "(worker_nsight_options); the controller does "
                                                                         "bookkeeping on the CPU, with no kernels to trace",
    "*.torch_memory.stack_depth": "torch's allocator history records whole stacks (stacks=python or all) and takes no depth",
    "data.micro_batch_size": "verl's SFT trainer marks it deprecated and reads only data.micro_batch_size_per_gpu, as "
                             "rlcore does",
    "*fsdp*.seed": "rlcore seeds every worker's initialisation and sampling from trainer.seed (the SFT trainer: engine.seed)",
    "*entropy_from_logits_chunk_size": "rlcore's log-prob head sizes its chunk of tokens from the vocabulary, so that one "
                                       "float32 [chunk, vocab] block stays under a fixed size (rlcore/models/logits.py)",
    "*fsdp*.use_torch_compile": "the role's use_torch_compile decides what rlcore compiles (the log-prob head's per-chunk "
                                "kernels; the SFT trainer: engine.use_torch_compile)",
    "*pad_to_length": "rlcore's packed forward takes any total length (varlen attention), so nothing is padded to a bucket",
    "*pad_to_length_bucket": "rlcore's packed forward takes any total length (varlen attention), so nothing is padded to a "
                             "bucket",
    "*fsdp*.forward_only": "rlcore builds each frozen role (reference, reward model, teachers) without an optimizer and "
                           "each trained role with one, whatever this says",
    "actor_rollout_ref.actor.calculate_entropy": "rlcore logs actor/entropy every step from the old-log-prob pass (or the "
                                                 "update's own forward when that pass is skipped)",
    "actor_rollout_ref.*.rollout_n": "rlcore reads actor_rollout_ref.rollout.n, which this key follows (as in verl)",
    "actor_rollout_ref.actor.use_remove_padding": "actor_rollout_ref.model.use_remove_padding decides for every role of the "
                                                  "policy (this key follows it, as in verl)",
    "*checkpoint.strict": "rlcore checks that a step folder holds every state it loads before it loads any, and stops "
                          "on a partial one naming what is missing (verl with strict=False loads what is there)",
    "*checkpoint.async_save": "rlcore writes a checkpoint before the next step starts (a background save would race the "
                              "next update's writes to the same parameters)",
    "critic.model.custom_chat_template": "the critic reads the policy's token ids, rendered in the policy's template "
                                         "(actor_rollout_ref.model.custom_chat_template)",
    "*.profiler.tool_config.torch.schedule.*": "rlcore's torch profiler records every worker call of each profiled step "
                                               "(global_profiler.steps; tool_config.torch.discrete: one trace per call)",
    "*.profiler.tool_config.torch.profile_token_*": "rlcore profiles whole rollout calls, not a window of decoded tokens",
    "*finish_hook_*": "rlcore runs no command after a trace is written: the traces are under global_profiler.save_path "
                      "when the run ends",
    "*relocate_results": "rlcore writes each trace where it stays, under global_profiler.save_path",
    "actor_rollout_ref.rollout.nnodes": "verl 0.9 places a standalone rollout so (its separate_async trainer); rlcore's "
                                        "rollout pool of its own is rollout.nnodes x rollout.n_gpus_per_node "
                                        "(actor_rollout_ref.hybrid_engine=False)",
    "actor_rollout_ref.rollout.n_gpus_per_node": "verl 0.9 places a standalone rollout so (its separate_async trainer); "
                                                 "rlcore's rollout pool of its own is rollout.nnodes x "
                                                 "rollout.n_gpus_per_node (actor_rollout_ref.hybrid_engine=False)",
    "actor_rollout_ref.rollout.scheduling_policy": "rlcore's engines admit a step's requests in the order they come (verl's "
                                                   "fcfs)",
    "actor_rollout_ref.rollout.skip_tokenizer_init": "rlcore's engines always take and return token ids",
    "actor_rollout_ref.rollout.moe_load_balance_metrics_interval": "rlcore logs the routers' load from the training "
                                                                   "forward every step (actor/moe/*)",
    "data.audio_key": "rlcore's multimodal rows carry images (data.image_key); it reads no audio column",
    "trainer.esi_redundant_time": "rlcore watches no cloud instance's expiry: trainer.save_freq, and the checkpoint a "
                                  "SIGTERM'd run writes before it stops, keep its progress (docs/reliability.md)",
    "trainer.ray_wait_register_center_timeout": "rlcore's workers join through Ray placement groups, whose wait "
                                                "trainer.placement_timeout_s bounds",
    "actor_rollout_ref.model.lora.freeze_*": "rlcore's Megatron engine trains text models, whose base weights LoRA always "
                                             "freezes: there is no vision tower or projection to freeze",
    "trainer.use_v1": "rlcore has one trainer loop for verl's v0 and v1 trainers (its modes: trainer.v1.trainer_mode)",
    "trainer.v1.sync": "verl's sync trainer takes no options",
    "trainer.v1.separate_async.num_warmup_batches": "rlcore's rollouter fills its whole staleness window from the start "
                                                    "(the rollout runs up to max_off_policy_threshold - 1 steps ahead)",
    "trainer.v1.separate_async.hybrid_rollout.switch_*": "read only with hybrid_rollout.enable_switch=True, which rlcore "
                                                         "refuses",
    "trainer.v1.separate_async.hybrid_rollout.adaptive_switch_threshold": "read only with hybrid_rollout.enable_switch="
                                                                          "True, which rlcore refuses",
    "trainer.v1.sampler.sync_refill_failed_groups": "rlcore scores a sample whose scorer failed reward_model.error_score "
                                                    "and trains on its group; no group is generated again",
    "trainer.v1.sampler.sampler_kwargs": "the arguments of trainer.v1.sampler.custom_sampler, which rlcore refuses",
    "reward.reward_manager.module.*": "read only with reward.reward_manager.source=importlib (a reward-manager class of "
                                      "your own), which rlcore refuses",
    "data.ignore_input_ids_mismatch": "rlcore never tokenizes a conversation's turns one by one: each turn's tokens are "
                                      "what rendering it adds to the turns before, so there is no concatenation to "
                                      "compare; a chat template that rewrites earlier turns is refused at load, naming the row",
    "data.num_workers": "rlcore tokenizes every row once at start and a batch only pads in-memory lists, so there is no "
                        "per-batch work for loader processes to overlap",
    "data.balance_dp_token": "verl's own SFT trainer does not implement it either (\"to be implemented\"); rlcore's "
                             "use_dynamic_bsz fills every rank's micro-batches up to max_token_len_per_gpu",
    "critic.model.tokenizer_path": "the critic reads the policy's token ids, which actor_rollout_ref.model's tokenizer "
                                   "made; a tokenizer of its own is never loaded",
    "trainer.max_critic_ckpt_to_keep": "rlcore keeps the actor and the critic in one global_step_N folder, pruned by "
                                       "trainer.max_actor_ckpt_to_keep",
    "algorithm.filter_groups.max_inflight_gen_batches": "verl's v1 replay buffer bounds by it how many refill prompts "
                                                        "generate at once while filtered groups are replaced; rlcore's "
                                                        "loop generates and scores one batch of data.gen_batch_size "
                                                        "prompts at a time before it draws the next, so one batch is "
                                                        "in flight whatever it says (data.gen_batch_size sets the size)",
    "distillation.distillation_loss.clip_ratio": "the policy-gradient form clips with clip_ratio_low and clip_ratio_high "
                                                 "(distillation.distillation_loss.*), as verl's vanilla policy loss reads them",
}

# pattern -> (a value other than the default that validation refuses with the reason, the overrides it is refused
# under): the schema test composes each
MEGATRON = ("actor_rollout_ref.actor.strategy=megatron",)
MEGATRON_LORA = (*MEGATRON, "actor_rollout_ref.model.lora.rank=8")
DISTILLATION = ("distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/teacher")
REFUSED: dict[str, tuple[Any, tuple[str, ...]]] = {
    "data.return_multi_modal_inputs": (False, ()),
    "distillation.distillation_loss.policy_loss_mode": ("gspo", DISTILLATION),
    "actor_rollout_ref.model.lora.type": ("dora", MEGATRON_LORA),
    "actor_rollout_ref.model.lora.dropout": (0.1, MEGATRON_LORA),
    "actor_rollout_ref.model.lora.lora_B_init_method": ("kaiming", MEGATRON_LORA),
    "*optim.optimizer": ("SGD", ()),
    "*optim.optimizer_impl": ("torchao.optim", ()),
    "reward.reward_manager.source": ("importlib", ()),
    "trainer.v1.separate_async.hybrid_rollout.enable_switch": (True, ("trainer.v1.trainer_mode=separate_async",)),
    "trainer.v1.sampler.custom_sampler.*": ("my_sampler.py", ()),
    "actor_rollout_ref.model.lora.adapter_path": ("adapter", MEGATRON_LORA),
    "critic.model.enable_activation_offload": (True, ("algorithm.adv_estimator=gae",)),
    "actor_rollout_ref.rollout.logprobs_mode": ("raw_logprobs", ()),
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module": ("my_backend", ()),
    "actor_rollout_ref.rollout.multi_turn.function_tool_path": ("tools.py", ()),
    "data.function_tool_path": ("tools.py", ()),
    "data.mm_processor_kwargs": ({"max_pixels": 1024}, ()),
    "trainer.default_hdfs_dir": ("hdfs://checkpoints", ()),
    "*.megatron.override_mcore_model_config": ({"num_layers": 2}, MEGATRON),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": ("nccl", ()),
    "actor_rollout_ref.rollout.over_sample_rate": (0.1, ()),
    "engine.forward_only": (True, ()),  # the SFT trainer's (tests/trainer/test_supervised.py)
    "actor_rollout_ref.*.router_replay.record_file": ("routes.pt", ()),
    "actor_rollout_ref.*.router_replay.replay_file": ("routes.pt", ()),
    "*.megatron.use_dist_checkpointing": (True, MEGATRON),
    "*.megatron.use_megatron_fsdp": (True, MEGATRON),
    "*.megatron.context_parallel_size": (2, MEGATRON),
    "actor_rollout_ref.rollout.agent.custom_async_server.path": ("server.py", ()),
}


def schema_leaves(schema: type, prefix: str = "") -> Iterator[str]:
    """Every leaf key of a schema dataclass (dict-typed fields such as override_config are leaves)."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from schema_leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def matching(pattern: str, keys: typing.Iterable[str]) -> list[str]:
    return [key for key in keys if fnmatch.fnmatchcase(key, pattern)]


def no_effect_reason(key: str) -> str | None:
    return next((why for pattern, why in NO_EFFECT.items() if fnmatch.fnmatchcase(key, pattern)), None)


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value as written, interpolations unresolved: a key left at a default that follows another key (e.g.
    critic.model.tokenizer_path follows the actor's model path) is not set, whatever it resolves to."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not OmegaConf.is_config(parent) or leaf not in parent:
        return None
    return OmegaConf.to_container(parent, resolve=False)[leaf]


@functools.lru_cache(maxsize=None)
def _defaults(schema: type) -> DictConfig:
    """The schema's default tree, built once per schema (building it deep-copies every node: a fifth of a second), and
    only read."""
    return OmegaConf.structured(schema)


@functools.lru_cache(maxsize=None)
def _no_effect_keys(schema: type) -> tuple[tuple[str, str, Any, Any], ...]:
    """(key, why, default value, default as written) of each no-effect key of a schema, found once per schema:
    matching every leaf against every pattern cost half of each rlcore-plan check (and of each run's start)."""
    defaults = _defaults(schema)
    found = ((key, no_effect_reason(key)) for key in schema_leaves(schema))
    return tuple((key, why, _value(defaults, key), _raw(defaults, key)) for key, why in found if why is not None)


def ineffective_settings(cfg: DictConfig) -> list[str]:
    """One line per key of `cfg` that has no effect in rlcore and is set to something other than its default."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return []
    lines = []
    for key, why, default, default_raw in _no_effect_keys(schema):
        value = _value(cfg, key)
        if value != default and _raw(cfg, key) != default_raw:
            lines.append(f"{key}={value}: accepted for verl compatibility, no effect in rlcore: {why}")
    return lines
