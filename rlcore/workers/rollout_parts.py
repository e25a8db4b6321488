"""What every worker that holds a rollout engine builds the same way, colocated with the actor (the hybrid engine,
rlcore.workers.actor_rollout_ref) or on its own pool (rlcore.workers.rollout): the engine's arguments from config,
the multi-turn agent loop, sampling parameters, and one generation call."""

from __future__ import annotations

import torch

from rlcore.config.agent_loop_config import load_agent_loop_config
from rlcore.config.interaction_config import load_interaction_config
from rlcore.config.tool_config import load_tool_config, tool_config_key_of, tools_enabled
from rlcore.config.typed import dotted
from rlcore.models.vision import MEDIA_COLUMNS
from rlcore.protocol import DataProto
from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings
from rlcore.rollout.agent_runner import AgentRunner
from rlcore.rollout.base import RolloutEngine, SamplingParams, assemble_sequences
from rlcore.rollout.factory import build_rollout_from_config
from rlcore.tools.interaction import build_interactions
from rlcore.tools.runner import ToolRunner


def build_rollout_parts(config, tokenizer, device, rank: int) -> tuple[RolloutEngine, AgentLoop | AgentRunner | None]:
    """The rollout engine and, with tools configured, the agent loop around it; with custom agent loops, the runner
    that routes each row to its loop by name (the tool agent among them)."""
    rollout = build_rollout_from_config(config, tokenizer.pad_token_id, device, rank)
    tools = agent_loop(config, rollout, tokenizer) if tools_enabled(config) else None
    agent = config.actor_rollout_ref.rollout.agent
    if not agent.agent_loop_config_path:
        return rollout, tools
    return rollout, AgentRunner(rollout, tokenizer, config, load_agent_loop_config(agent.agent_loop_config_path), agent.default_agent_loop,
                                tools, config.data.max_prompt_length)


def agent_loop(config, rollout: RolloutEngine, tokenizer) -> AgentLoop:
    """Multi-turn rollouts with tools and/or interactions: the tool processes (started at a trajectory's first call)
    and the interactions serve every rollout of this worker."""
    settings = config.actor_rollout_ref.rollout
    mt = settings.multi_turn
    key = tool_config_key_of(config)
    specs = load_tool_config(dotted(config)(key)) if key else []  # an interaction alone needs no tools
    interactions = build_interactions(load_interaction_config(mt.interaction_config_path)) if mt.interaction_config_path else None
    turns = MultiTurnSettings(max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
                              max_parallel_calls=mt.max_parallel_calls, max_tool_response_length=mt.max_tool_response_length,
                              tool_response_truncate_side=mt.tool_response_truncate_side, format=mt.format)
    return AgentLoop(rollout, tokenizer, ToolRunner(specs, settings.agent.num_workers, mt.tool_timeout_s), turns,
                     dict(config.data.apply_chat_template_kwargs), interactions)


def sampling_params(config, tokenizer, meta: dict) -> SamplingParams:
    """Training sampling, validation sampling (`meta["validate"]`: val_kwargs) or greedy (`meta["greedy"]`)."""
    rollout = config.actor_rollout_ref.rollout
    kw = rollout.val_kwargs if meta.get("validate") else rollout
    return SamplingParams(
        max_tokens=rollout.response_length, temperature=kw.temperature, top_p=kw.top_p, top_k=kw.top_k,
        do_sample=kw.do_sample and not meta.get("greedy"),  # greedy: ReMax's baseline response
        stop_token_ids=[] if rollout.ignore_eos else [tokenizer.eos_token_id],
    )


def generate(rollout: RolloutEngine, loop: AgentLoop | AgentRunner | None, prompts: DataProto, sampling: SamplingParams
             ) -> tuple[DataProto, dict]:
    """One generation call: the assembled sequences (+ multi-turn counters; the interactions' turn scores as a
    non-tensor column) and the engine's stats as metrics."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    before = rollout.gate.version
    if loop is None:
        media = {key: list(prompts.non_tensor_batch[key]) for key in MEDIA_COLUMNS if key in prompts.non_tensor_batch}
        out = rollout.generate(ids, mask, sampling, **media)  # a vision-language policy's rows: their images
        counters = {}
        stats = {f"rollout/{k}": v for k, v in getattr(rollout, "stats", {}).items()}  # KV slots, prefills
    elif "multi_modal_data" in prompts.non_tensor_batch:
        raise ValueError("multi-turn rollouts and agent loops with images are not supported yet (their turns would drop the "
                         "images); train this vision-language model with single-turn rollouts")
    elif isinstance(loop, AgentRunner):
        ids, mask, out, counters = loop.generate_batch(ids, mask, sampling, prompts.non_tensor_batch)
        stats = dict(loop.stats)  # engine calls and requests of the custom loops, the tool agent's counts
    else:
        rows = prompts.non_tensor_batch
        column = lambda key: list(rows[key]) if key in rows else None  # noqa: E731
        out, counters = loop.run(ids, mask, sampling, column("tools_kwargs"), column("interaction_kwargs"), column("raw_prompt"))
        stats = dict(loop.stats)  # engine calls, prefill tokens computed and reused across turns
    if out.versions is None and before is not None:  # an engine that does not say: the versions around the call
        out.versions = torch.tensor([[before, rollout.gate.version]]).expand(len(ids), 2).clone()
    tensors = {k: v for k, v in counters.items() if isinstance(v, torch.Tensor)}
    return DataProto.from_dict({**assemble_sequences(ids, mask, out), **tensors},
                               {k: v for k, v in counters.items() if k not in tensors}), stats
