"""How long a step whose scorer hangs on every sample takes to fail: `--samples` samples through the reward manager
with an isolated scorer that sleeps forever, `reward_model.score_workers`, `score_timeout_s` and `max_error_rate` at
their schema defaults unless given. Prints the seconds from the call to the step's RuntimeError, the timeouts it
waited for and the scoring processes alive at the peak (sampled every 50 ms).

    .venv/bin/python bench/score_hang.py                    # the defaults: 256 samples, 2 workers, 60 s, 0.1
    .venv/bin/python bench/score_hang.py --timeout_s 6      # the same shape, timeouts scaled down 10x
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rlcore.config.reward_model_schema import RewardModelConfig

# torch and the reward manager are imported in main(): spawned scoring processes re-import this module, and a
# trainer's main module (rlcore.train) imports neither, so neither may inflate the processes' set-up time here.

HUNG_SCORER = "import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    time.sleep(3600)\n"


def batch(tokenizer, num_samples: int):
    import torch

    from rlcore.protocol import DataProto

    ids = torch.tensor([tokenizer.convert_tokens_to_ids(list("42")) + [tokenizer.eos_token_id]] * num_samples)
    mask = torch.ones_like(ids)
    return DataProto.from_dict({"responses": ids, "response_mask": mask, "attention_mask": mask},
                               {"data_source": ["custom"] * num_samples, "reward_model": [{"ground_truth": "42"}] * num_samples})


def peak_children(stop: threading.Event, peak: list[int]) -> None:
    """Samples this process's live children (the resource tracker aside) until `stop`."""
    me = psutil.Process()
    while not stop.wait(0.05):
        peak[0] = max(peak[0], sum(map(is_scorer, me.children())))


def is_scorer(process: psutil.Process) -> bool:
    try:  # it may end while we look
        return process.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(process.cmdline())
    except psutil.Error:
        return False


def main() -> None:
    defaults = RewardModelConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--workers", type=int, default=defaults.score_workers)
    parser.add_argument("--timeout_s", type=float, default=defaults.score_timeout_s)
    parser.add_argument("--max_error_rate", type=float, default=defaults.max_error_rate)
    args = parser.parse_args()
    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.reward.isolation import IsolatedScorer
    from rlcore.reward.manager import RewardManager, ScoreGuard

    tokenizer = build_char_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scorer.py"
        path.write_text(HUNG_SCORER)
        scorer = IsolatedScorer(None, str(path), "compute_score", args.workers, args.timeout_s)
        reward = RewardManager(tokenizer, None, "data_source", scorer, ScoreGuard(max_error_rate=args.max_error_rate))
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=peak_children, args=(stop, peak), daemon=True)
        watcher.start()
        start = time.monotonic()
        try:
            reward(batch(tokenizer, args.samples))
            message = "the step did not fail"
        except RuntimeError as err:
            message = str(err).split(". First")[0]
        took = time.monotonic() - start
        stop.set()
        watcher.join()
        reward.close()
    print(f"{args.samples} hung samples, {args.workers} workers, score_timeout_s={args.timeout_s:g}, "
          f"max_error_rate={args.max_error_rate:g}: failed after {took:.1f} s = {took / args.timeout_s:.2f} x score_timeout_s; "
          f"peak scoring processes {peak[0]}; {message}")


if __name__ == "__main__":
    main()
