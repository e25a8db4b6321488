"""TRL's GRPOTrainer on the grpo_arith_cpu_v1 workload; run by bench/vs_trl.py with the TRL venv's python.

    trl_side.py --assets DIR --steps N --beta B

DIR holds what bench/vs_trl/assets.py built: model/, tokenizer/, prompts.jsonl. TRL's defaults differ from the
spec in several places (see the settings below and the reference notes): bf16 and gradient checkpointing off,
lr 1e-5 constant, one optimizer step per generation batch of 64 completions. Each full step is timed from
on_step_begin to on_step_end (TRL's own step_time leaves out the optimizer step); step 1 is excluded. Prints one
JSON line on stdout; TRL's logging goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

# The HF stack reads these at import time: no hub, no tracker.
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true", TRANSFORMERS_VERBOSITY="error")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def exact_sum(completions, answer, **_):
    """The spec's reward: 1.0 if the stripped completion starts with the exact sum, not followed by a digit."""
    out = []
    for text, want in zip(completions, answer):
        match = re.match(r"\d+", text.strip())
        out.append(1.0 if match is not None and match.group(0) == want else 0.0)
    return out


class StepTimer(TrainerCallback):
    """Wall-clock seconds of every full step (generation + reward + [reference] + forward/backward + AdamW)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--out_dir", default="/tmp/trl_side_out")
    args = parser.parse_args()
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo_arith_cpu_v1.json")) as f:
        spec = json.load(f)
    g = spec["grpo"]
    rows = [json.loads(line) for line in open(os.path.join(args.assets, "prompts.jsonl"))]
    dataset = Dataset.from_list(rows)
    model_dir = os.path.join(args.assets, "model")  # a path, so that beta > 0 can reload the reference from it
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.assets, "tokenizer"))
    config = GRPOConfig(
        output_dir=args.out_dir, max_steps=args.steps, seed=spec["seed"], use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, learning_rate=g["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        per_device_train_batch_size=g["completions_per_step"], generation_batch_size=g["completions_per_step"],
        gradient_accumulation_steps=1,  # generation batch = 64 completions = one optimizer step
        num_iterations=1, num_generations=g["num_generations"],
        max_completion_length=g["max_completion_length"], temperature=1.0, top_p=1.0, top_k=0, beta=args.beta,
        epsilon=g["clip_epsilon"], loss_type="dapo", scale_rewards="group", report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=exact_sum, args=config, train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[timer])
    trainer.train()
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    timed = timer.seconds[1:]
    print(json.dumps({"framework": "trl", "trl_version": trl.__version__, "steps": args.steps, "beta": args.beta,
                      "torch_threads": torch.get_num_threads(), "step_s": timed, "median_step_s": statistics.median(timed),
                      "mean_reward_last": rewards[-1] if rewards else None}))


if __name__ == "__main__":
    sys.stdout.flush()
    main()
