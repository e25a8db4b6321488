"""Shared fixtures: a real (tiny) HF model + tokenizer saved to a local directory, the tiny task data, and the one
local Ray cluster that the tests training through Ray join."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import ExitStack

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_tiny_model_dir(path: str, seed: int = 0, layers: int = 2, hidden: int = 64, max_position_embeddings: int = 64) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_llama_dir(path: str, seed: int = 1, layers: int = 4, hidden: int = 64, heads: int = 8) -> str:
    """A tiny Llama: tied embeddings, no attention bias, 4 query heads per KV head, and an odd vocabulary (one more
    than the tokenizer's), so tensor parallelism has to pad it. vLLM's CPU attention needs head_dim >= 32
    (hidden=128, heads=4)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlcore.data.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 1 if len(tokenizer) % 2 == 0 else len(tokenizer), hidden_size=hidden, intermediate_size=96,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 4, max_position_embeddings=64, rope_theta=5e5,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def pytest_addoption(parser):
    parser.addoption("--demos", action="store_true", help="also run the features' learning demos (tests marked `demo`; `make test-demos`)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` run vLLM for real; where it is not importable (the main venv) they are skipped, not faked.
    Tests marked `demo` (a feature's learning demo, minutes each) run only with --demos: `make test` keeps every engine
    path's learning run and the features' few-step checks (docs/contributing.md, the test budget)."""
    import importlib.util

    skips = []
    if importlib.util.find_spec("vllm") is None:
        skips.append(("vllm", pytest.mark.skip(reason="vLLM is not installed here: `make test-vllm` runs these in .cache/vllm_venv")))
    if not config.getoption("--demos"):
        skips.append(("demo", pytest.mark.skip(reason="a feature's learning demo: `make test-demos` runs it (docs/contributing.md)")))
    for item in items:
        for marker, skip in skips:
            if item.get_closest_marker(marker):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_task_dir(tmp_path_factory) -> str:
    from rlcore.data.synthetic import write_task

    out = str(tmp_path_factory.mktemp("tiny_task"))
    write_task(out, num_train=512, num_test=64, min_digits=1, max_digits=2, seed=0)
    return out


@pytest.fixture(scope="session")
def demo_assets() -> str:
    """The demo's own assets (task data + SFT warm-start that stops at 25% train-pool accuracy) where `make train`
    keeps them, .cache/tiny_cpu: prepare() reuses a build whose settings stamp matches and rebuilds a stale one, so
    the SFT (about a minute) runs once for the main suite, the vLLM suite, the benchmarks and the demo together."""
    from rlcore.cli.prepare_tiny import prepare

    out = os.path.join(REPO, ".cache", "tiny_cpu")
    prepare(out)  # one builder at a time (another pytest run, the benchmarks, make train): the others wait
    return out


@pytest.fixture(scope="session")
def tools_assets() -> str:
    """The tool-use demo's assets and SFT warm-start (~100 s) where `make train-tools` keeps them, .cache/tiny_tools,
    reused in the same way."""
    from rlcore.cli.prepare_tiny_tools import prepare

    out = os.path.join(REPO, ".cache", "tiny_tools")
    prepare(out)
    return out


# The pytest run's local Ray cluster: started by the first test that asks for `ray_cluster`, shut down (with any of
# its processes that outlive ray.shutdown) at the end of the run, or before a test that starts its own.
_SHARED_RAY = ExitStack()


def _end_session(signum, frame) -> None:
    pytest.exit("SIGTERM: ending the test session", returncode=128 + signum)


def close_shared_ray() -> None:
    """For a test that needs a driver without the shared cluster (it is started again by the next test asking)."""
    _SHARED_RAY.close()


@pytest.fixture
def ray_cluster(request):
    """For tests that train through Ray: rlcore's run() joins a running cluster instead of starting and stopping its
    own (~6 s of each run on 2 cores), so they all join this one. After the test nothing of it is left on the
    cluster: no live actor, no placement group, every CPU free, no worker process (what "Ray shut down" used to show).

    A test marked `own_ray_cluster` runs as a user's run does instead: without the shared cluster, its run() starts
    a cluster of its own (ray_kwargs.ray_init.num_cpus: split pools and extra resource pools need more logical CPUs
    than the shared cluster's 2, which set each rank's threads) and must have shut it down at the end."""
    import ray
    from e2e_utils import assert_no_workers_left

    from rlcore.controller.ray_session import ray_cluster as local_cluster

    if request.node.get_closest_marker("own_ray_cluster"):
        close_shared_ray()
        yield
        assert not ray.is_initialized(), "run() left the cluster it started running"
        return
    if not ray.is_initialized():  # first use, or a test shut it down (a test with a cluster of its own)
        close_shared_ray()
        _SHARED_RAY.enter_context(local_cluster(None, None))
        # The cluster's SIGTERM handler raises SystemExit where the signal lands, which pytest reports as one failed
        # test and goes on to the next: a SIGTERM to the test run ends the session instead (its clean-up included).
        signal.signal(signal.SIGTERM, _end_session)
    yield
    if ray.is_initialized():  # (a SIGTERM ending the session has shut the cluster down already)
        assert_no_workers_left()


# Each test's seconds (set-up + call + tear-down), written to .cache/test_durations.json (or $TEST_DURATIONS_FILE:
# the numerics passes keep their own) at the end of the run for `make test-durations` (tests/durations.py) to compare
# with the checked-in baseline.
_DURATIONS: dict[str, float] = {}
_SUMMARY: list[str] = []
_STARTED = [0.0]


def pytest_sessionstart(session):
    import time

    _STARTED[0] = time.monotonic()


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    import time

    close_shared_ray()
    if "rank_pool" in sys.modules:
        rank_pool = sys.modules["rank_pool"]
        rank_pool.close_all()
        _SUMMARY.append("rank processes: " + ", ".join(f"{what} {n}" for what, n in rank_pool.COUNTS.items()))
    from rlcore.controller.hosts import TOTALS

    if TOTALS:  # how many worker processes the run's Ray groups started, and how many they found warm
        _SUMMARY.append("worker hosts: " + ", ".join(f"{what} {n}" for what, n in sorted(TOTALS.items())))
    if not _DURATIONS:
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:  # the vLLM suite's venv: the budget tracked is the main suite's
        return
    from durations import LAST, record

    record(os.environ.get("TEST_DURATIONS_FILE", LAST), _DURATIONS, time.monotonic() - _STARTED[0], sys.argv[1:])


def pytest_terminal_summary(terminalreporter):
    for line in _SUMMARY:
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test that sets torch's thread count (a toy SFT on one thread) does not slow every later test down."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """A test that initialises a process group in-process must destroy it; the next test starts clean."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
