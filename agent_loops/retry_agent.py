"""A custom agent loop in verl's shape for the tiny task (docs/multi-turn.md): answer, and when the answer is not a
number, say so as the user and let the model answer again, up to `retries` times.

Written as a verl agent loop is; the only rlcore-specific line is the import (verl's:
`from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput`).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from rlcore.rollout.agent_api import AgentLoopBase, AgentLoopOutput


class RetryAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, retries: int = 1, feedback: str = "digits only", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retries, self.feedback = retries, feedback
        self.response_length = self.config.actor_rollout_ref.rollout.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        request_id = uuid4().hex  # one id for every turn: the server reuses the conversation's KV
        response, mask, log_probs, turns = [], [], [], 0
        while True:
            out = await self.server_manager.generate(request_id, prompt_ids=prompt_ids + response, sampling_params=sampling_params)
            response += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += out.log_probs
            turns += 1
            answer = self.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()
            if answer.isdigit() or turns > self.retries or out.stop_reason != "completed":
                break
            feedback = await self.apply_chat_template([{"role": "user", "content": self.feedback}], remove_system_prompt=True)
            response += feedback
            mask += [0] * len(feedback)  # context: the user's words are not trained on
            log_probs += [0.0] * len(feedback)
            if len(response) >= self.response_length:
                break
        n = self.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response[:n], response_mask=mask[:n],
                               response_logprobs=log_probs[:n], num_turns=2 * turns, metrics={})
