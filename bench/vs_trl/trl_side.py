"""TRL's GRPOTrainer on the grpo_arith_cpu_v1 workload; run with the TRL venv's python (setup_trl_venv.sh).

    trl_side.py --assets DIR --steps N --beta B [--threads T]

DIR holds model/, tokenizer/ and prompts.jsonl, built from the spec by the orchestrator. TRL's defaults differ
from the spec in several places (bf16, gradient checkpointing, lr, schedule): every setting is spelled out below.
Each full step (generation + reward + [reference] + forward/backward + AdamW) is timed from on_step_begin to
on_step_end, because TRL's own step_time leaves the optimizer step out; step 1 (warm-up) is excluded. The last
line on stdout is one JSON object; everything else, TRL's logs included, goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import time

# The HF stack reads these at import time: no hub access, no tracker.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true", TRANSFORMERS_VERBOSITY="warning")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def exact_sum(completions: list[str], answer: list[str], **_) -> list[float]:
    """The spec's reward: 1.0 if the stripped completion starts with the exact sum, not followed by a digit."""
    out = []
    for text, want in zip(completions, answer, strict=True):
        match = re.match(r"\d+", text.strip())
        out.append(1.0 if match is not None and match.group(0) == want else 0.0)
    return out


def cpu_pressure_some_avg10() -> float | None:
    """/proc/pressure/cpu "some avg10": % of the last 10 s some task waited for a CPU (a noisy neighbour shows)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = next(line for line in f if line.startswith("some"))
        return float(some.split("avg10=")[1].split()[0])
    except (OSError, StopIteration, IndexError, ValueError):
        return None


class StepTimer(TrainerCallback):
    """Wall clock of every full step. on_step_begin fires before training_step, where TRL generates; on_step_end
    after the optimizer and scheduler steps and before logging, so logging stays out of the time."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.pressure: list[float | None] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)
        self.pressure.append(cpu_pressure_some_avg10())


def checkpointing_args(enabled: bool) -> dict[str, bool]:
    """Gradient checkpointing on or off under every name this transformers has for it: 5.23 added
    activation_checkpointing beside gradient_checkpointing, 5.17 (the GPU machine's) has only the old one
    (measured: GRPOConfig() got an unexpected keyword argument 'activation_checkpointing')."""
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {name: enabled for name in ("gradient_checkpointing", "activation_checkpointing") if name in names}


def grpo_config(spec: dict, steps: int, beta: float, out_dir: str) -> GRPOConfig:
    g = spec["grpo"]
    on_cpu, bf16 = spec["bench"]["device"] == "cpu", g["dtype"] == "bfloat16"
    config = GRPOConfig(
        output_dir=out_dir, max_steps=steps, seed=spec["seed"], use_cpu=on_cpu,
        # TRL defaults bf16 (autocast, even on CPU) and gradient checkpointing to True; the spec says which it wants.
        # transformers 5.23 added activation_checkpointing beside gradient_checkpointing: set each that exists.
        bf16=bf16, fp16=False, **checkpointing_args(g["gradient_checkpointing"]),
        # TRL defaults to lr 1e-6 with linear decay; the spec: AdamW 1e-5 constant, no warm-up, no weight decay.
        learning_rate=g["learning_rate"], lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        # One optimizer step per generation batch: 64 completions (16 prompts x 4) generated and trained at once.
        # TRL counts the batch in completions and refuses generation_batch_size together with
        # steps_per_generation, so the generation batch (64) follows from steps_per_generation=1 (checked below).
        per_device_train_batch_size=g["completions_per_step"], steps_per_generation=g["steps_per_generation"],
        gradient_accumulation_steps=g["gradient_accumulation_steps"], num_iterations=g["num_iterations"],
        num_generations=g["num_generations"], max_completion_length=g["max_completion_length"],
        shuffle_dataset=g["shuffle_prompts"],
        # Plain multinomial sampling; TRL's top_k=0 means no top-k filter (the spec's null).
        temperature=g["sampling"]["temperature"], top_p=g["sampling"]["top_p"], top_k=0, min_p=None,
        repetition_penalty=g["sampling"]["repetition_penalty"],
        beta=beta, epsilon=g["clip_epsilon"], loss_type="dapo", scale_rewards="group", use_bias_correction_kl=True,
        # logging_steps=1 so every step's reward and completion length reach log_history; nothing saved or reported.
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, log_level="warning",
        dataloader_num_workers=0,
    )
    assert config.generation_batch_size == g["completions_per_step"], config.generation_batch_size
    assert config.bf16 == bf16 and not config.fp16 and all(getattr(config, k) == v for k, v in checkpointing_args(g["gradient_checkpointing"]).items())
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", required=True, help="dir with model/, tokenizer/, prompts.jsonl")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--spec", default=os.path.join(HERE, "grpo_arith_cpu_v1.json"))
    parser.add_argument("--out_dir", default="/tmp/trl_side_out", help="Trainer's output_dir (nothing is saved)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2: step 1 is excluded from the timing")

    # Keep the real stdout for the JSON line only: Trainer's PrinterCallback print()s its logs, and native code may
    # write to fd 1 too, so both Python's stdout and fd 1 point at stderr from here on.
    result_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.spec) as f:
        spec = json.load(f)
    g = spec["grpo"]
    with open(os.path.join(args.assets, "prompts.jsonl")) as f:
        dataset = Dataset.from_list([json.loads(line) for line in f if line.strip()])
    # Loaded from a path, not built in memory: with beta > 0 TRL reloads the reference from
    # model.config._name_or_path (with the policy's dtype and attention implementation). fp32 weights in both specs:
    # the GPU spec's bf16 is autocast over them (TRL's bf16=True), as rlcore's FSDP2 keeps fp32 master weights.
    model = AutoModelForCausalLM.from_pretrained(os.path.join(args.assets, "model"), dtype=torch.float32,
                                                 attn_implementation=spec["model"]["attn_implementation"])
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.assets, "tokenizer"))
    assert tokenizer.padding_side == "left"

    timer = StepTimer()
    config = grpo_config(spec, args.steps, args.beta, args.out_dir)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_sum, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    assert len(timer.seconds) == args.steps, (len(timer.seconds), args.steps)

    # One log entry per step (logging_steps=1). TRL's completion lengths count up to and including <eos>, padding
    # excluded (the spec's completion_tokens), so mean_length x 64 is the step's completion-token count.
    logs = {e["step"]: e for e in trainer.state.log_history if "reward" in e}
    timed = timer.seconds[1:]
    tokens = [logs.get(s, {}).get("completions/mean_length") for s in range(2, args.steps + 1)]
    tokens_per_s = None
    if all(t is not None for t in tokens):
        tokens_per_s = sum(round(t * g["completions_per_step"]) for t in tokens) / sum(timed)
    result = {
        "framework": "trl", "trl_version": trl.__version__, "torch_version": torch.__version__,
        "transformers_version": sys.modules["transformers"].__version__, "steps": args.steps, "beta": args.beta,
        "torch_threads": torch.get_num_threads(),
        "step_s": [round(s, 4) for s in timed], "median_step_s": round(statistics.median(timed), 4),
        "mean_reward_last": logs[args.steps]["reward"] if args.steps in logs else None,
        "completion_tokens_per_s": round(tokens_per_s, 1) if tokens_per_s is not None else None,
        "completion_tokens": [round(t * g["completions_per_step"]) if t is not None else None for t in tokens],
        "cpu_pressure_some_avg10": timer.pressure[1:],
    }
    result_out.write(json.dumps(result) + "\n")
    result_out.flush()


if __name__ == "__main__":
    main()
