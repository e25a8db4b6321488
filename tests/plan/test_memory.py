"""The memory plan: terms computed by hand, the seed article's facts, every recipe planned (and pinned: the batch
plan and memory plan of every recipe against tests/plan/golden_plans.json, so a refactor of the config layer shows
any fact it moves; RLCORE_UPDATE_GOLDEN=1 rewrites the file after an intended change, to be reviewed in the diff)."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
from conftest import build_tiny_model_dir

from rlcore.config import CONFIG_DIR, compose
from rlcore.config.validate import diagnose
from rlcore.families import arch_of
from rlcore.plan import memory_plan
from rlcore.plan.arch import BUILTIN
from rlcore.plan.memory import GIB, _activations, _training_state
from rlcore.rollout.sizing import adapted_params
from rlcore.utils.sizes import LOGITS_CHUNK_BYTES

ARR = "actor_rollout_ref"
RECIPES = sorted((Path(CONFIG_DIR).parent / "recipes").glob("*.yaml"))
SMALL = arch_of(dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=100, max_position_embeddings=512, tie_word_embeddings=False), "small")


class _FSDP:
    def __init__(self, **kw):
        self.dtype, self.model_dtype, self.reshard_after_forward, self.offload_policy = "bfloat16", "fp32", True, False
        self.__dict__.update(kw)


def _plan(*overrides, recipe=None):
    return _plans(*overrides, recipe=recipe)[1]


def _plans(*overrides, recipe=None):
    """(the BatchPlan, the MemoryPlan) of a composed config."""
    cfg = compose(([f"recipe={recipe}"] if recipe else []) + list(overrides))
    plan, _ = diagnose(cfg)
    return plan, memory_plan(cfg, plan)


GOLDEN = Path(__file__).parent / "golden_plans.json"


def golden_facts(plan, mem) -> dict:
    """What a recipe's plans say, as the golden file pins it: every batch fact, every role's items in GiB."""
    return {"batch": dataclasses.asdict(plan) if plan else None,
            "memory": {r.role: [[what, round(gib, 3)] for what, gib in r.items] for r in mem.roles}}


def _role(mem, name):
    return next(r for r in mem.roles if r.role == name)


def test_small_arch_terms_by_hand():
    # block: q 64x64, k/v 64x32, o 64x64, gate/up 64x128, down 128x64, two norms of 64
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert SMALL.layer_params() == layer
    assert SMALL.params() == 100 * 64 + 2 * layer + 64 + 100 * 64
    assert SMALL.params(value_head=True) == 100 * 64 + 2 * layer + 64 + 64
    assert SMALL.lora_params(8) == 2 * 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)


def test_fsdp_state_by_hand():
    p, root = SMALL.params(), SMALL.root_params()
    zero3 = _training_state(SMALL, _FSDP(), shards=4, lora_rank=0, value_head=False, trainable=True)
    assert zero3["weights"] * GIB == p * 4 / 4 and zero3["grads"] * GIB == p * 4 / 4
    assert zero3["optim"] * GIB == p * 8 / 4
    assert zero3["gathered"] * GIB == (root + 2 * SMALL.layer_params()) * 2
    zero2 = _training_state(SMALL, _FSDP(reshard_after_forward=False), 4, 0, False, True)
    assert zero2["gathered"] * GIB == p * 2
    lora = _training_state(SMALL, _FSDP(model_dtype="bf16"), 4, 8, False, True)
    t = SMALL.lora_params(8)
    assert lora["weights"] * GIB == (p * 2 + t * 4) / 4 and lora["optim"] * GIB == t * 8 / 4
    frozen = _training_state(SMALL, _FSDP(), 4, 0, False, trainable=False)
    assert frozen["grads"] == frozen["optim"] == 0 and frozen["weights"] * GIB == p * 4 / 4
    assert _training_state(SMALL, _FSDP(model_dtype="bf16"), 4, 0, False, trainable=False)["weights"] * GIB == p * 2 / 4
    assert _training_state(SMALL, _FSDP(offload_policy=True), 4, 0, False, True)["weights"] == 0


def test_activations_by_hand():
    per_layer = 2 * (6 * 64 + 2 * 32 + 4 * 128)
    act, logits = _activations(SMALL, 1000, 400, 2, ckpt=False, backward=True, value_head=False)
    # 400 x 100 float32 logits fit in one chunk: logits, softmax, their gradient (fp32) and a bf16 copy
    assert act * GIB == 2 * 1000 * per_layer and logits * GIB == 400 * 100 * (2 + 4 + 4 + 4)
    act, _ = _activations(SMALL, 1000, 400, 2, ckpt=True, backward=True, value_head=False)
    assert act * GIB == 2 * 1000 * 64 * 2 + 1000 * per_layer
    assert _activations(SMALL, 1000, 400, 2, True, True, value_head=True)[1] == 0
    # TP=2 splits the attention and MLP intermediates; the hidden-size tensors too only with sequence parallelism.
    tp_act, _ = _activations(SMALL, 1000, 400, 2, ckpt=False, backward=True, value_head=False, tp=2)
    sp_act, _ = _activations(SMALL, 1000, 400, 2, ckpt=False, backward=True, value_head=False, tp=2, sp=True)
    assert tp_act * GIB == 2 * 1000 * 2 * (6 * 64 + (2 * 32 + 4 * 128) / 2) and sp_act * GIB == 2 * 1000 * per_layer / 2


def test_the_log_prob_head_holds_one_chunk_not_the_micro_batch():
    qwen = BUILTIN["qwen2.5-7b"]
    chunk = LOGITS_CHUNK_BYTES // (4 * qwen.vocab)  # 220 tokens of a 152k vocabulary in 128 MiB
    _, logits = _activations(qwen, 24000, 16000, 2, ckpt=True, backward=True, value_head=False)
    assert logits * GIB == chunk * qwen.vocab * 14  # 0.44 GiB, where full logits would be 16000 x 152064 x 10 B = 22.7 GiB
    _, tp4 = _activations(qwen, 24000, 16000, 2, ckpt=True, backward=True, value_head=False, tp=4)
    tp4_chunk = LOGITS_CHUNK_BYTES // (4 * (qwen.vocab // 4))
    assert tp4_chunk >= 4 * chunk and tp4 * GIB == tp4_chunk * (qwen.vocab // 4) * 14  # ~the same bytes, 4x the tokens


# --- the seed article: Llama3-8B reward model on six 24 GB RTX 4090s ---------------------------------------
SEED_8192 = ["critic.model.lora_rank=0", "critic.model.fsdp_config.model_dtype=fp32",
             "critic.model.fsdp_config.reshard_after_forward=True", "critic.model.use_remove_padding=False",
             "data.max_response_length=7168", "critic.ppo_max_token_len_per_gpu=8192",
             f"{ARR}.actor.ppo_max_token_len_per_gpu=8192"]


def test_seed_8192_full_finetune_zero3_is_oom():
    critic = _role(_plan(*SEED_8192, recipe="llama3_8b_rm_lora"), "critic update")
    assert critic.verdict == "OOM" and critic.capacity == 24
    state = dict(critic.items)
    assert state["fp32 master weights / 6"] + state["gradients / 6"] + state["AdamW moments / 6"] == pytest.approx(
        16 * BUILTIN["llama3-8b"].params(value_head=True) / 6 / GIB)  # 18.6 GiB of state alone
    assert critic.levers and critic.levers[0][1] > critic.peak - critic.capacity  # the top lever is enough


def test_seed_4096_lora_zero2_fits():
    mem = _plan("reward.reward_model.enable=False", recipe="llama3_8b_rm_lora")
    critic = _role(mem, "critic update")
    assert critic.verdict == "fits" and "ZeRO-2-like" in " ".join(what for what, _ in critic.items)
    assert {r.role: r.verdict for r in mem.roles} == {"rollout": "fits", "actor update": "fits", "critic update": "fits"}
    # Of the seed's four changes, the plan ranks LoRA among the levers of the 8192 config, enough on its own
    oom = _role(_plan(*SEED_8192, recipe="llama3_8b_rm_lora"), "critic update")
    lora_saving = next(saving for lever, saving in oom.levers if lever.startswith("critic.model.lora_rank=64 critic.model.lora_alpha=64"))
    assert lora_saving > oom.peak - oom.capacity
    lora_only = _plan(*SEED_8192, "critic.model.lora_rank=64", "critic.model.fsdp_config.model_dtype=bf16",
                      recipe="llama3_8b_rm_lora")
    assert _role(lora_only, "critic update").verdict == "fits"


def test_seed_reward_model_colocated_with_the_critic():
    # --colocate_critic_reward: a third process on each of the 6 cards; the frozen RM's weights are parked on the CPU
    # between scoring passes, so the critic's update sees only one more runtime (tight, not OOM).
    mem = _plan(recipe="llama3_8b_rm_lora")
    rm, critic = _role(mem, "reward model scores"), _role(mem, "critic update")
    p = BUILTIN["llama3-8b"].params(value_head=True)
    assert rm.verdict == "fits" and dict(rm.items)["fp32 weights (frozen) / 6"] == pytest.approx(4 * p / 6 / GIB)
    assert dict(critic.items)["runtime x 3 processes (colocated worker groups)"] == 3.0
    assert critic.verdict == "tight" and not any(what.startswith("reward model state") for what, _ in critic.items)
    kept = _role(_plan("reward_model.model.fsdp_config.param_offload=False", recipe="llama3_8b_rm_lora"), "critic update")
    assert kept.verdict == "OOM" and dict(kept.items)["reward model state kept between phases"] == pytest.approx(4 * p / 6 / GIB)
    # its own 2 cards: sharded over 2, nothing of it on the critic's
    own = _plan("reward.reward_model.enable_resource_pool=True", "reward.reward_model.nnodes=1", "reward.reward_model.n_gpus_per_node=2",
                recipe="llama3_8b_rm_lora")
    assert "fp32 weights (frozen) / 2" in dict(_role(own, "reward model scores").items)
    assert _role(own, "reward model scores").where == "2 devices, own pool" and _role(own, "critic update").verdict == "fits"


def test_seed_reward_model_training_plan_through_rlcore_rm_config():
    from rlcore.plan import supervised_memory_plan
    from rlcore.train_rm import compose_rm

    fits = supervised_memory_plan(compose_rm(config_name="rm_llama3_8b_lora"), pairs=True)
    (role,) = fits.roles
    assert fits.ok and role.role == "reward model update" and role.verdict == "fits" and role.capacity == 24
    assert dict(role.items)["activations, 8192 tokens, checkpointed"] > 0  # a pair: 2 x 4096 tokens per micro-batch
    seed = ["data.max_length=8192", "model.lora_rank=0", "model.fsdp_config.reshard_after_forward=True", "model.fsdp_config.model_dtype=fp32"]
    (oom,) = supervised_memory_plan(compose_rm(seed, config_name="rm_llama3_8b_lora"), pairs=True).roles
    assert oom.verdict == "OOM"
    state = dict(oom.items)
    assert state["fp32 master weights / 6"] + state["gradients / 6"] + state["AdamW moments / 6"] == pytest.approx(
        16 * BUILTIN["llama3-8b"].params(value_head=True) / 6 / GIB)
    lora = next(saving for lever, saving in oom.levers if lever.startswith("model.lora_rank=64 model.lora_alpha=64"))
    assert lora > oom.peak - oom.capacity  # LoRA alone is enough
    sft = supervised_memory_plan(compose_rm(config_name="rm_llama3_8b_lora"), pairs=False).roles[0]
    assert sft.role == "SFT update" and "log-prob head" in " ".join(what for what, _ in sft.items)


def test_qwen2_7b_grpo_fits_on_8x80gb():
    mem = _plan(recipe="qwen2_7b_grpo")
    assert mem.capacity == 80 and mem.ok
    assert {r.role: r.verdict for r in mem.roles} == {"rollout": "fits", "actor update": "fits",
                                                      "reference log-probs": "fits"}
    rollout = _role(mem, "rollout")
    assert dict(rollout.items)["vLLM: gpu_memory_utilization 0.6 x 80 GiB"] == 48
    assert "sequences of 1536 tokens at once per TP2 replica (of 1280 per step)" in rollout.note
    # the same run on 24 GB cards does not fit, and the plan says which knob matters most
    small = _plan("trainer.device_memory_gb=24", recipe="qwen2_7b_grpo")
    assert _role(small, "actor update").verdict == "OOM" and not small.ok


def test_qwen2_7b_grpo_lora_saves_the_reference_and_the_optimizer_state():
    full, lora = _plan(recipe="qwen2_7b_grpo"), _plan(recipe="qwen2_7b_grpo_lora")
    assert lora.ok and [r.role for r in lora.roles] == ["rollout", "actor update"]  # reference = base, adapters off
    update = dict(_role(lora, "actor update").items)
    trainable = BUILTIN["qwen2.5-7b"].lora_params(64)
    assert trainable == pytest.approx(161e6, rel=0.01)
    assert update["AdamW moments / 8"] == pytest.approx(8 * trainable / 8 / GIB)
    # measured by the plan: the update drops by 12.1 GiB per GPU and the state kept beside vLLM by 8.6 GiB
    assert _role(full, "actor update").peak - _role(lora, "actor update").peak == pytest.approx(12.1, abs=0.05)
    assert _role(full, "rollout").peak - _role(lora, "rollout").peak == pytest.approx(8.6, abs=0.05)


def test_lora_without_merging_plans_the_adapters_in_the_rollout_and_their_sync():
    """model.lora.merge=False (verl's default): vLLM's LoRA slots are part of its budget and each sync sends the
    161M fp32 adapter parameters of a rank-64 7B (615 MiB); merged, every weight goes every sync. The native engine
    holds the adapters beside its base copy (kept while asleep) and, merged, is sent the adapted weights alone."""
    trainable = BUILTIN["qwen2.5-7b"].lora_params(64)
    unmerged, merged = (_role(_plan(f"actor_rollout_ref.model.lora.merge={m}", recipe="qwen2_7b_grpo_lora"), "rollout") for m in (False, True))
    assert f"LoRA slots {trainable * 2 / 2 / GIB:.2f} GiB of it (1 x max_lora_rank 64)" in unmerged.note  # bf16, over TP2
    assert f"each sync sends the adapters alone, {trainable * 4 / 2**20:.1f} MiB (lora.merge=False)" in unmerged.note
    assert "each sync sends every weight merged" in merged.note and unmerged.peak == merged.peak
    native = _role(_plan("actor_rollout_ref.rollout.name=native", recipe="qwen2_7b_grpo_lora"), "rollout")
    assert dict(native.items)["LoRA adapters over the base (rank 64)"] == pytest.approx(trainable * 2 / GIB)
    merging = _role(_plan("actor_rollout_ref.rollout.name=native", "+actor_rollout_ref.rollout.engine_kwargs.native.merge_adapters=true",
                          recipe="qwen2_7b_grpo_lora"), "rollout")  # merged into its weights from a copy of the adapted base
    copy = dict(merging.items)["adapted base weights' copy (merge_adapters)"]
    assert copy == pytest.approx(adapted_params(BUILTIN["qwen2.5-7b"]) * 2 / GIB) and merging.peak == pytest.approx(native.peak + copy)


def test_a_bf16_reference_halves_its_weights():
    fp32 = dict(_role(_plan(recipe="qwen2_7b_grpo"), "reference log-probs").items)
    bf16 = dict(_role(_plan(f"{ARR}.ref.fsdp_config.model_dtype=bf16", recipe="qwen2_7b_grpo"), "reference log-probs").items)
    assert bf16["bf16 weights (frozen) / 8"] == pytest.approx(fp32["fp32 weights (frozen) / 8"] / 2)


def test_vllm_without_room_for_its_weights_is_oom():
    mem = _plan("actor_rollout_ref.rollout.gpu_memory_utilization=0.1", recipe="qwen2_7b_grpo")
    rollout = _role(mem, "rollout")
    assert rollout.verdict == "OOM" and rollout.note.startswith("OOM: vLLM needs weights 7.1")


def test_a_rollout_that_never_sleeps_is_planned_beside_every_training_phase():
    """free_cache_engine=False: vLLM keeps its whole budget (weights and KV cache) through the update; the native
    engine its weight copy, KV pool and graphs' buffers, where asleep it would keep its weight copy alone."""
    verdicts = {}
    for name in ("vllm", "native"):
        asleep, awake = (_plan(f"{ARR}.rollout.name={name}", f"{ARR}.rollout.free_cache_engine={keep}", recipe="qwen2_7b_grpo")
                         for keep in (True, False))
        engine = sum(gib for what, gib in _role(awake, "rollout").items if what not in ("runtime",) and "kept between phases" not in what)
        update = dict(_role(awake, "actor update").items)
        assert update["rollout engine awake (free_cache_engine=False)"] == pytest.approx(engine)
        kept = dict(_role(asleep, "actor update").items).get("rollout engine asleep", 0.0)
        assert _role(awake, "actor update").peak == pytest.approx(_role(asleep, "actor update").peak - kept + engine)
        verdicts[name] = (_role(asleep, "actor update").verdict, _role(awake, "actor update").verdict)
    assert verdicts["vllm"] == ("fits", "tight")  # vLLM's 48 GiB beside a 7B's update on 80 GiB


def test_max_length_beyond_the_models_positions_is_an_error():
    mem = _plan("data.max_response_length=8000", recipe="llama_70b_multinode")
    assert mem.errors == ["data.max_prompt_length + data.max_response_length = 9024 exceeds actor_rollout_ref.model.path's "
                          "max_position_embeddings 8192; use data.max_response_length=7168 or a shorter prompt length"]


def test_unknown_model_is_named_not_guessed():
    mem = _plan(f"{ARR}.model.path=/nowhere/my-model", recipe="qwen2_7b_grpo")
    assert mem.roles == [] and "no config.json at /nowhere/my-model" in mem.arch_notes[0]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_is_planned_and_fits(recipe, request, tmp_path):
    # the tiny recipes point at assets `make train` builds: plan them on the test fixture's model instead, or on one
    # with the tool-use demo's 272 positions (prompt 16 + response 256) for that recipe
    local = recipe.stem.startswith("tiny")
    model = request.getfixturevalue("tiny_model_dir") if local else None
    if recipe.stem == "tiny_cpu_tools":
        model = build_tiny_model_dir(str(tmp_path), max_position_embeddings=272)
    # a CPU recipe's device is a share of this machine's memory unless stated: stated, so the golden facts hold anywhere
    where = [f"{ARR}.model.path={model}", f"critic.model.path={model}", "trainer.device_memory_gb=12"] if local else []
    plan, mem = _plans(*where, recipe=recipe.stem)
    assert mem.roles and not mem.errors and mem.ok
    facts = json.loads(json.dumps(golden_facts(plan, mem)).replace(str(tmp_path), "<tmp>"))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    if os.environ.get("RLCORE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({**golden, recipe.stem: facts}, indent=1, sort_keys=True) + "\n")
    else:
        assert facts == golden.get(recipe.stem), f"{recipe.stem}: its plans moved (RLCORE_UPDATE_GOLDEN=1 rewrites {GOLDEN.name})"
    # The seed's card is full: its critic update shares each 24 GB card with vLLM's share and three processes'
    # runtimes (actor, critic, colocated reward model): 90.3% (test_seed_reward_model_colocated_with_the_critic).
    tight = {"critic update"} if recipe.stem == "llama3_8b_rm_lora" else set()
    assert all(r.verdict == ("tight" if r.role in tight else "fits") for r in mem.roles), [(r.role, r.verdict, round(r.peak, 1)) for r in mem.roles]


def test_megatron_layout_splits_state_over_tp_pp_and_dp():
    mem = _plan(recipe="qwen2_32b_grpo_megatron")
    actor = dict(_role(mem, "actor update").items)
    p = BUILTIN["qwen2.5-32b"].params()
    assert actor["bfloat16 weights / TP4 x PP2"] == pytest.approx(2 * p / 8 / GIB)
    assert actor["fp32 master + AdamW / TP4 x PP2 x DP1"] == pytest.approx(12 * p / 8 / GIB)
    two_nodes = dict(_role(_plan("trainer.nnodes=2", recipe="qwen2_32b_grpo_megatron"), "actor update").items)
    assert two_nodes["fp32 master + AdamW / TP4 x PP2 x DP2"] == pytest.approx(12 * p / 16 / GIB)
    # verl's optimizer override: megatron-core's hybrid optimizer keeps offload_fraction of that state on the host
    hybrid = [f"+{ARR}.actor.optim.override_optimizer_config.{k}" for k in ("optimizer_cpu_offload=True", "optimizer_offload_fraction=0.75",
                                                                          "use_precision_aware_optimizer=True")]
    offloaded = dict(_role(_plan(*hybrid, recipe="qwen2_32b_grpo_megatron"), "actor update").items)
    assert offloaded["fp32 master + AdamW / TP4 x PP2 x DP1, 75% of it on the host (optimizer_cpu_offload)"] == pytest.approx(12 * p / 8 / GIB / 4)


def test_native_decode_graphs_are_planned_on_cuda_unless_eager():
    cuda = ["recipe=qwen2_7b_grpo", f"{ARR}.rollout.name=native", "trainer.device_memory_gb=80"]
    graphs = dict(_role(_plan(*cuda), "rollout").items)
    vocab_logits = [gib for what, gib in graphs.items() if what == "decode CUDA graphs' logits"]
    assert vocab_logits == [pytest.approx(2 * 256 * 152064 * 2 / GIB)]  # max_num_seqs x vocab in bf16, twice
    eager = dict(_role(_plan(*cuda, f"{ARR}.rollout.enforce_eager=True"), "rollout").items)
    assert "decode CUDA graphs' logits" not in eager
    cpu = dict(_role(_plan(*cuda, "trainer.device=cpu", "trainer.device_memory_gb=100"), "rollout").items)
    assert "decode CUDA graphs' logits" not in cpu  # CPU: eager


def test_a_mixture_of_experts_is_planned_by_what_it_holds_and_what_a_token_computes():
    """Qwen3-30B-A3B: every expert's weights are held (30.5B, sharded), but a token's activations pass through its
    top-8 experts of 768 (6144 wide), not the config's dense intermediate_size, and the FLOPs count the active 3.35B."""
    mem = _plan(recipe="qwen3_30b_a3b_grpo")
    assert any("30.53B (3.35B active: top-8 of 128 experts per layer)" in note for note in mem.arch_notes)
    arch = BUILTIN["qwen3-30b-a3b"]
    assert arch.mlp_width == 8 * 768 and arch.active_blocks_params() < arch.blocks_params() / 8
    actor = dict(_role(mem, "actor update").items)
    assert actor["fp32 master weights / 8"] == pytest.approx(4 * arch.params() / 8 / GIB)


def test_megatron_expert_parallelism_splits_the_experts_over_ep_and_their_optimizer_over_the_expert_data_parallel_ranks():
    """verl's Qwen3-30B-A3B layout (TP1, EP8) on 2 nodes: the dense part (attention, routers, embeddings) is whole on each
    rank, its AdamW split 16 ways; the routed experts split 8 ways, their AdamW over the 2 expert-data-parallel copies."""
    arch = BUILTIN["qwen3-30b-a3b"]
    routed, dense = arch.routed_params(), arch.params() - arch.routed_params()
    items = dict(_role(_plan(recipe="qwen3_30b_a3b_grpo_megatron"), "actor update").items)
    split = "TP1 x PP1 (experts: EP8 x ETP1)"
    assert items[f"bfloat16 weights / {split}"] == pytest.approx((dense + routed / 8) * 2 / GIB)
    assert items[f"fp32 gradient buffer / {split}"] == pytest.approx((dense + routed / 8) * 4 / GIB)
    assert items[f"fp32 master + AdamW / {split} x DP16"] == pytest.approx((dense / 16 + routed / 8 / 2) * 12 / GIB)
    one_node = dict(_role(_plan("trainer.nnodes=1", recipe="qwen3_30b_a3b_grpo_megatron"), "actor update").items)
    assert one_node[f"fp32 master + AdamW / {split} x DP8"] == pytest.approx((dense / 8 + routed / 8) * 12 / GIB)


@pytest.mark.parametrize("use_kl_loss, use_kl_in_reward, expected", [(True, False, True), (False, True, True), (False, False, False)])
def test_the_reference_is_planned_whenever_the_run_computes_it(use_kl_loss, use_kl_in_reward, expected):
    """One answer to "does this run use a reference policy" (rlcore.config.validate.uses_reference): the memory
    plan without a batch plan fell back to actor.use_kl_loss alone and left out the reference that a KL penalty in
    the reward (algorithm.use_kl_in_reward) computes."""
    cfg = compose(["recipe=qwen2_7b_grpo", f"actor_rollout_ref.actor.use_kl_loss={use_kl_loss}",
                   f"algorithm.use_kl_in_reward={use_kl_in_reward}"])
    for plan in (diagnose(cfg)[0], None):
        roles = [r.role for r in memory_plan(cfg, plan).roles]
        assert ("reference log-probs" in roles) == expected, (plan is None, roles)


def test_a_teacher_is_planned_on_the_actor_devices_or_a_pool_of_its_own():
    """The recipe's Qwen3-32B teacher: bf16 weights sharded over the 8 GPUs it shares with the actor, offloaded
    between its passes (so vLLM's row does not carry them); kept resident, they join every other phase's row; on a
    pool of its own, its row holds nothing of the actor's. A vLLM teacher keeps its share of the device the whole run."""
    teacher = BUILTIN["qwen3-32b"].params(False)
    mem = _plan(recipe="qwen3_8b_opd_qwen3_32b")
    assert mem.ok and [r.role for r in mem.roles] == ["rollout", "actor update", "teacher teacher_model scores"]
    scores = dict(_role(mem, "teacher teacher_model scores").items)
    assert scores["bfloat16 weights (frozen) / 8"] == pytest.approx(teacher * 2 / 8 / GIB)
    assert "actor state kept between phases" in scores and "teacher state kept between phases" not in dict(_role(mem, "rollout").items)
    resident = _plan("distillation.teacher_models.teacher_model.inference.param_offload=False", recipe="qwen3_8b_opd_qwen3_32b")
    assert dict(_role(resident, "rollout").items)["teacher state kept between phases"] == pytest.approx(teacher * 2 / 8 / GIB)
    own = _plan("distillation.n_gpus_per_node=8", "distillation.nnodes=1", recipe="qwen3_8b_opd_qwen3_32b")
    assert "actor state kept between phases" not in dict(_role(own, "teacher teacher_model scores").items)
    vllm = _plan("distillation.teacher_models.teacher_model.inference.name=vllm", recipe="qwen3_8b_opd_qwen3_32b")
    assert [r.role for r in vllm.roles] == ["rollout", "actor update"]
    assert dict(_role(vllm, "actor update").items)["teacher state kept between phases"] == pytest.approx(0.5 * 80)


def test_a_vision_language_model_plans_its_tower_and_a_frozen_tower_drops_its_gradients_and_moments(tmp_path):
    """Qwen2.5-VL-7B's config.json (its published shapes): the tower's 676.6M parameters join the language model's;
    actor.freeze_vision_tower=True keeps them in the weights and drops their gradients and AdamW moments."""
    import json

    from rlcore.families.vision import tower_params

    text = dict(model_type="qwen2_5_vl_text", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, max_position_embeddings=128000, tie_word_embeddings=False)
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    config = dict(model_type="qwen2_5_vl", text_config=text, vision_config=vision, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tower = tower_params(config)
    # the language model planned as Qwen2.5's block: 8,292,166,656 in all, the published count
    assert tower == 676_550_144 and arch_of(config, "vl").params() == arch_of(dict(text, model_type="qwen2"), "lm").params() + tower
    assert arch_of(config, "vl").params() == 8_292_166_656
    plans = [_plan(f"{ARR}.model.path={tmp_path}", f"{ARR}.actor.freeze_vision_tower={frozen}", recipe="qwen2_7b_grpo")
             for frozen in (False, True)]
    full, frozen = (dict(_role(p, "actor update").items) for p in plans)
    moments = next(k for k in full if k.startswith("AdamW moments"))
    grads = next(k for k in full if k.startswith("grad"))
    shards = int(moments.rsplit("/", 1)[1])
    assert full[moments] - frozen[moments] == pytest.approx(tower * 8 / shards / GIB)
    assert full[grads] - frozen[grads] == pytest.approx(tower * 4 / shards / GIB)
    # the tower's activations: images filling every prompt token, 4 patches each; a frozen tower keeps one block's
    # transients (no backward through it), a trained one every checkpointed block input plus one block's saved tensors
    tower_act = [next((k, v) for k, v in plan.items() if k.startswith("vision tower activations")) for plan in (full, frozen)]
    patches = 4 * 8000  # the recipe's 24000-token micro-batches of 512 prompt + 1024 response tokens: 8000 prompt tokens
    assert tower_act[0][0] == tower_act[1][0] == f"vision tower activations, <= {patches} patches (images filling the prompts)"
    bf16 = 2
    assert tower_act[0][1] == pytest.approx(patches * bf16 * (32 * 1280 + 8 * 1280 + 4 * 3420) / GIB)
    assert tower_act[1][1] == pytest.approx(patches * bf16 * (2 * 1280 + 2 * 3420) / GIB)


def test_the_critic_update_is_planned_with_the_batch_plans_micro_batch_as_the_worker_runs_it():
    """verl's deprecated global critic.ppo_micro_batch_size (samples over all ranks) is what the critic's worker
    divides by its data-parallel ranks; the memory plan read only the per-GPU key and planned one row instead."""
    rows = ["critic.use_dynamic_bsz=False", "critic.forward_micro_batch_size_per_gpu=4"]
    by_rank = _plans(*rows, "critic.ppo_micro_batch_size_per_gpu=4", recipe="ppo_7b_colocate")
    by_total = _plans(*rows, "critic.ppo_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size=32", recipe="ppo_7b_colocate")
    assert by_rank[0].critic_micro_batch_size_per_rank == by_total[0].critic_micro_batch_size_per_rank == 4  # 32 over 8 ranks
    assert dict(_role(by_total[1], "critic update").items) == dict(_role(by_rank[1], "critic update").items)


def test_the_native_kv_pool_is_planned_as_the_engine_sizes_it(tiny_model_dir):
    """The plan's slot count is the engine's own function (rlcore.rollout.sizing.native_kv_slots): the rank's
    samples, at most max_num_seqs, at most what the KV budget holds; the plan had every sample."""
    import torch

    from rlcore.rollout.native import NativeRollout

    base = [f"{ARR}.model.path={tiny_model_dir}", "trainer.device_memory_gb=12"]

    def kv_item(*overrides):
        return next(what for what, _ in _role(_plan(*base, *overrides, recipe="tiny_cpu"), "rollout").items if what.startswith("KV cache"))

    assert kv_item() == "KV cache, 128 sequences x 13 tokens"  # the rank's 128 samples
    assert kv_item(f"{ARR}.rollout.max_num_seqs=32") == "KV cache, 32 sequences x 13 tokens"
    sequence = NativeRollout(tiny_model_dir, 0, torch.device("cpu")).pool.geometry.bytes_per_token * 13
    engine = NativeRollout(tiny_model_dir, 0, torch.device("cpu"), kv_cache_memory_bytes=10 * sequence + 1)
    assert engine._num_slots(128, 1, 13) == 10
    assert kv_item(f"+{ARR}.rollout.engine_kwargs.native.kv_cache_memory_bytes={10 * sequence + 1}") == "KV cache, 10 sequences x 13 tokens"
