"""A distillation teacher on vLLM: scores finished samples (prompt + response) token by token with vLLM's prompt
log-probs (`distillation.teacher_models.<name>.inference.name=vllm`).

Each sample is one request over prompt + response with `SamplingParams(max_tokens=1, prompt_logprobs=K)`: the one
prefill gives, at every position after the first, the log-prob of the token actually there and the K most likely
tokens with theirs. The generated token is thrown away. The engine is rlcore's vLLM rollout adapter
(rlcore.rollout.vllm.VLLMRollout) loading the teacher's checkpoint instead of dummy weights, so it runs wherever the
rollout does (CUDA, vLLM's CPU build, external_launcher TP groups) with the same engine arguments.

What vLLM 0.32 computes here, read from its source (both model runners) and measured in
tests/rollout/test_vllm_teacher.py:
- Prompt log-probs are log_softmax(logits) in float32, never temperature-scaled: prompt tokens skip the sampler's
  processors, so `logprobs_mode="processed_logprobs"` changes nothing for them (v1/worker/gpu_model_runner.py
  `_get_prompt_logprobs_dict`; v1/worker/gpu/sample/prompt_logprob.py). log_softmax(logits / T) needs the full
  vocabulary's logits for its normaliser, which top-K log-probs do not carry, so T != 1 is refused
  (`check_temperature`) rather than answered with the T = 1 distribution.
- Each position holds K + 1 entries: the actual token (with its vocabulary rank) first, then torch.topk's K in
  descending order (`Sampler.gather_logprobs`); `flat_logprobs=True` hands them over as flat lists, read here as
  `[positions, K + 1]` tables without building a dict per position.
- A request asking for prompt log-probs never reads the prefix cache (`SamplingParams.skip_reading_prefix_cache`
  defaults to True then), so every position is computed; the teacher's engine is built without prefix caching
  anyway, as nothing could ever hit it.
- `max_logprobs` (default 20) caps K: the engine is built with max_logprobs = topk.
"""

from __future__ import annotations

import torch

from rlcore.config.distill_schema import TeacherInferenceConfig as _SCHEMA  # the engine's defaults are the config's
from rlcore.rollout.vllm import VLLMRollout

TEACHER_KEY = "distillation.teacher_models.{name}"
TOPK_KEY = "distillation.distillation_loss.topk"


def check_temperature(temperature: float, name: str) -> None:
    """vLLM's prompt log-probs are of softmax(logits) whatever the request's temperature (module docstring): a
    teacher on vLLM can only score at temperature 1."""
    if temperature != 1.0:
        key = f"{TEACHER_KEY.format(name=name)}.inference.temperature"
        raise ValueError(
            f"{key}={temperature}: a vLLM teacher scores with vLLM's prompt log-probs, which are of softmax(logits) at "
            f"temperature 1 whatever the sampling temperature (vLLM 0.32 applies no logits processor to prompt tokens), "
            f"and top-k log-probs cannot be rescaled exactly; set {key}=1.0, or score with "
            f"{TEACHER_KEY.format(name=name)}.inference.name=native, which divides the logits by the temperature")


class _TeacherEngine(VLLMRollout):
    """The rollout adapter with checkpoint weights: sleeping keeps them. The rollout's level-2 sleep discards weights
    (the next sync reloads them); a teacher's come from disk once, so it sleeps at level 1 (on CUDA the weights go to
    host memory and come back on wake-up; on CPU nothing sleeps)."""

    def sleep(self, level: int = 1) -> None:
        super().sleep(level=1)

    def prompt_log_probs(self, sequences: list[list[int]], topk: int) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per sequence, vLLM's prompt log-probs as `(ids, log_probs)` tables `[len - 1, 1 + topk]`: row p - 1 is
        about the token at position p, column 0 that token, columns 1.. the top-k; None for a sequence of < 2 tokens.
        Wakes the engine for the call if it sleeps, and puts it back."""
        all_sequences, mine = self._gather_tp(sequences)  # a TP group's ranks submit identical requests
        requests = [k for k, sequence in enumerate(all_sequences) if len(sequence) >= 2]
        params = self._sampling_cls(max_tokens=1, temperature=0.0, prompt_logprobs=topk, flat_logprobs=True, detokenize=False)
        asleep = "weights" not in self._awake
        if asleep:
            self.wake_up()
        try:
            outputs = self.llm.generate([{"prompt_token_ids": all_sequences[k]} for k in requests], params, use_tqdm=False)
        finally:
            if asleep:
                self.sleep()
        by_request = dict(zip(requests, outputs))
        return [self._tables(by_request[k].prompt_logprobs, all_sequences[k], topk) if k in by_request else None
                for k in range(mine.start, mine.stop)]

    @staticmethod
    def _tables(flat, sequence: list[int], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        length = len(sequence)
        # vLLM's layout (module docstring), checked: a different vLLM could reorder it silently.
        if len(flat.logprobs) != (length - 1) * (topk + 1) or flat.end_indices[0] != 0:
            raise RuntimeError(f"vLLM returned {len(flat.logprobs)} prompt log-probs for a {length}-token request with "
                               f"prompt_logprobs={topk}; expected {topk + 1} at each of positions 1..{length - 1}")
        ids = torch.tensor(flat.token_ids, dtype=torch.long).view(length - 1, topk + 1)
        if ids[:, 0].tolist() != sequence[1:]:
            raise RuntimeError("vLLM's prompt log-probs do not start each position with the prompt's own token")
        return ids, torch.tensor(flat.logprobs, dtype=torch.float32).view(length - 1, topk + 1)


class VLLMTeacher:
    """Scores samples with a teacher model held by one vLLM engine per process (per TP group with TP > 1, whose
    ranks must call `score` together, like the rollout's `generate`).

    On CUDA the engine sleeps between calls (weights in host memory, KV cache freed) so that a teacher colocated with
    the trainer holds no device memory while the actor trains; `score` wakes it for the call and leaves it as it
    found it. A caller scoring several batches in a row may `wake_up()` first and `sleep()` after."""

    def __init__(self, model_path: str, device: torch.device | None = None, name: str = "teacher_model", dtype: str = "bfloat16",
                 max_model_len: int | None = None, topk: int = 0, seed: int = 0, tensor_parallel_size: int = 1,
                 expert_parallel_size: int = 1, gpu_memory_utilization: float = _SCHEMA.gpu_memory_utilization, max_num_seqs: int = _SCHEMA.max_num_seqs,
                 max_num_batched_tokens: int = _SCHEMA.max_num_batched_tokens, enforce_eager: bool = _SCHEMA.enforce_eager, engine_kwargs: dict | None = None,
                 trust_remote_code: bool = False) -> None:
        """`device`: None = CUDA where available, else vLLM's CPU build. `name`: the teacher's entry in
        distillation.teacher_models (error messages name its keys). `topk`: the most top-k tokens any `score` call
        asks for (vLLM's max_logprobs). `engine_kwargs`: extra vLLM engine arguments (the inner dict of
        engine_kwargs.vllm), winning over these."""
        self.name = name
        key = TEACHER_KEY.format(name=name)
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if topk < 0:
            raise ValueError(f"{TOPK_KEY}={topk} must be >= 0 (0: the sampled tokens' log-probs only)")
        engine_kwargs = dict(engine_kwargs or {})
        max_logprobs = engine_kwargs.setdefault("max_logprobs", topk)
        if max_logprobs != -1 and max_logprobs < topk:
            raise ValueError(f"{key}.inference.engine_kwargs.max_logprobs={max_logprobs} is below {TOPK_KEY}={topk}: vLLM "
                             f"would refuse every request; remove it or set it to at least {topk}")
        self.topk = topk
        try:
            self.engine = _TeacherEngine(
                model_path, pad_token_id=0, device=device, dtype=dtype, seed=seed, tensor_parallel_size=tensor_parallel_size,
                expert_parallel_size=expert_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False, enforce_eager=enforce_eager,
                load_format="auto",  # the teacher's own checkpoint: no weight sync ever reaches it
                engine_kwargs=engine_kwargs, trust_remote_code=trust_remote_code)
        except ValueError as err:  # the adapter's checks name the rollout's keys
            raise ValueError(f"{key} (a vLLM teacher, built as the vLLM rollout is: read actor_rollout_ref.rollout.* below as "
                             f"{key}.inference.*): {err}") from err
        self.max_model_len = self.engine.llm.llm_engine.vllm_config.model_config.max_model_len
        self.vocab_size = self.engine._hf.vocab_size  # the teacher's top-k never asks for more ids than this

    def wake_up(self) -> None:
        self.engine.wake_up()

    def sleep(self) -> None:
        self.engine.sleep()

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, topk: int,
              temperature: float) -> dict[str, torch.Tensor]:
        """The teacher's log-probs on the response tokens of a batch laid out as rlcore's: prompts left-padded in the
        first P columns, responses right-padded in the last R = `response_len`; `attention_mask` marks real tokens.

        Returns `log_probs` float32 `[batch, R]` (log p_teacher(token) of each response token, 0 on padding) and,
        when `topk` K > 0, `topk_log_probs` float32 `[batch, R, K]` and `topk_ids` int64 `[batch, R, K]`: the
        teacher's K most likely tokens at each response position, by descending log-prob (0 / id 0 on padding).
        All of softmax(logits / temperature); only temperature 1 is possible on vLLM (`check_temperature`)."""
        check_temperature(temperature, self.name)
        if not 0 <= topk <= self.topk:
            raise ValueError(f"{TOPK_KEY}={topk}: this vLLM teacher was built for at most topk={self.topk} (vLLM's "
                             f"max_logprobs); build it with topk >= {topk}")
        batch, width = input_ids.shape
        if not 0 <= response_len <= width:
            raise ValueError(f"response_len={response_len} must lie in [0, {width}] (the batch's columns)")
        prompt_len = width - response_len
        real = attention_mask.cpu().bool()
        sequences = [row[m].tolist() for row, m in zip(input_ids.cpu(), real)]
        # Where each response column's token sits in its row's sequence of real tokens (the request vLLM sees).
        positions = (real.long().cumsum(-1) - 1)[:, prompt_len:]
        scored = real[:, prompt_len:]
        self._check_rows(sequences, positions, scored)
        tables = self.engine.prompt_log_probs(sequences, topk)
        out = {"log_probs": torch.zeros(batch, response_len)}
        if topk:
            out["topk_log_probs"] = torch.zeros(batch, response_len, topk)
            out["topk_ids"] = torch.zeros(batch, response_len, topk, dtype=torch.long)
        for i, table in enumerate(tables):
            if table is None:
                continue
            ids, log_probs = table
            # Row p - 1 of the table predicts the token at position p.
            rows = positions[i, scored[i]] - 1
            out["log_probs"][i, scored[i]] = log_probs[rows, 0]
            if topk:
                # vLLM hands them over in torch.topk's descending order; sorted again so that the contract does not
                # rest on that (stable: exact ties keep vLLM's order).
                values, order = log_probs[rows, 1:].sort(dim=-1, descending=True, stable=True)
                out["topk_log_probs"][i, scored[i]] = values
                out["topk_ids"][i, scored[i]] = ids[rows, 1:].gather(-1, order)
        return {k: v.to(input_ids.device) for k, v in out.items()}

    def _check_rows(self, sequences: list[list[int]], positions: torch.Tensor, scored: torch.Tensor) -> None:
        """A response token needs a token before it (vLLM gives the first position no log-prob), and a request must
        fit the context with its one generated token."""
        for i, sequence in enumerate(sequences):
            if scored[i].any() and int(positions[i, scored[i]].min()) == 0:
                raise ValueError(f"row {i} has a response but no prompt token: the teacher cannot score a sequence's first token")
            if len(sequence) + 1 > self.max_model_len:
                raise ValueError(f"row {i} holds {len(sequence)} tokens: with the one token vLLM generates it exceeds "
                                 f"{TEACHER_KEY.format(name=self.name)}.inference.max_model_len={self.max_model_len}; set it to at "
                                 f"least prompt length + response length + 1 = {len(sequence) + 1}")
