"""The reward-model role (`reward.reward_model.enable=True`): a frozen sequence-classification model scoring each
sample at its last token, written once over TrainEngine (verl's RewardModelWorker)."""

from __future__ import annotations

import time

from rlcore.controller.decorator import Dispatch, register
from rlcore.data.rm_inputs import chat_sequences, policy_sequences, right_aligned, same_tokenization, token_level
from rlcore.engine.factory import build_engine, engine_spec
from rlcore.models.hf import import_external_lib, load_tokenizer, named_load
from rlcore.plan.micro_plan import REWARD_MODEL
from rlcore.protocol import DataProto
from rlcore.reward.manager import decode_responses
from rlcore.workers import phases
from rlcore.workers.common import RoleWorker, layout_of, run_forward


class RewardModelWorker(RoleWorker):
    """One process per device holding a shard of the reward model (no optimizer)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        cfg, policy, path = self.config.reward_model, self.config.actor_rollout_ref.model, self.config.reward.reward_model.model_path
        import_external_lib(cfg.model.external_lib, "reward_model.model.external_lib")  # registers a custom architecture
        spec = engine_spec(cfg.strategy, cfg.model, cfg, None, 0.0, total_steps, kind="reward", model_path=path)
        with named_load("reward.reward_model.model_path", path):
            self.engine = build_engine(cfg.strategy, spec, self.device, key="reward_model.strategy")
            self.tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
        self.layouts["reward_model"] = layout_of(self.engine)
        # The policy's tokenizer as the policy renders (its custom_chat_template): a custom template makes even the
        # same model's reward model re-render the conversation in its own template.
        with named_load("reward_model.model.input_tokenizer", cfg.model.input_tokenizer, "the tokenizer"):
            self.input_tokenizer = load_tokenizer(cfg.model.input_tokenizer, policy.trust_remote_code, policy.custom_chat_template)
        # verl's rule: a reward model with another tokenizer reads the conversation re-rendered in its own template.
        self.retokenize = not same_tokenization(self.tokenizer, self.input_tokenizer)
        phases.leave(self.engine)

    def _sequences(self, data: DataProto) -> list[list[int]]:
        if not self.retokenize:
            return policy_sequences(data.batch["input_ids"], data.batch["attention_mask"])
        texts = decode_responses(self.input_tokenizer, data)
        return chat_sequences(self.tokenizer, list(data.non_tensor_batch["raw_prompt"]), texts)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, mesh="reward_model")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` `[batch, response_len]`: each sample's score on its last response token."""
        cfg = self.config.reward_model
        start = time.perf_counter()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        inputs = DataProto.from_dict(right_aligned(self._sequences(data), pad, cfg.max_length))
        micro = self.micro_batches(REWARD_MODEL, self.engine)
        with phases.running(self.engine, "reward_model"):
            out = run_forward(self.engine, inputs, micro, lambda outputs, mb: {"scores": outputs["scores"]})
        if not len(out):
            return out
        meta = {"timing": {"timing_s/reward_model_on_rank": time.perf_counter() - start}}
        return DataProto.from_dict({"rm_scores": token_level(out.batch["scores"][:, 0], data.batch["response_mask"])}, meta_info=meta)
