"""`rlcore-plan --rehearse`: the FSDP2 engines of a 7B-shaped recipe run on fake tensors, phase by phase, beside the plan."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlcore.cli.plan import main
from rlcore.plan.arch import BUILTIN, arch_from_hf_config, hf_config

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^rehearsal: (\w+) +([\d.]+) +([\d.]+|-) +([+-]\d+%|-) +(fits|OOM)")


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_hf_config_describes_the_architecture_it_was_written_from(name):
    arch = BUILTIN[name]
    again = arch_from_hf_config(hf_config(arch), name)
    assert again == arch


def plan(capsys, monkeypatch, *argv):
    """`rlcore-plan *argv` in this process, from the repository root (recipes' relative paths): its exit code and
    output as a finished process's would be (the rehearsal's fake world and tensors end with the call)."""
    monkeypatch.chdir(REPO)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def rehearse(tmp_path, capsys, monkeypatch, *overrides):
    # Qwen2.5-7B's shapes with 4 of its 28 blocks (seconds instead of a minute), over a fake world of 2 ranks.
    model = tmp_path / "qwen2.5-7b-4layers"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**hf_config(BUILTIN["qwen2.5-7b"]), "num_hidden_layers": 4}))
    args = ["recipe=qwen2_7b_grpo", f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4608", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=3072",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=3072", *overrides]
    proc = plan(capsys, monkeypatch, "--elsewhere", "--rehearse", *args)
    rows = {m[1]: (float(m[2]), None if m[3] == "-" else float(m[3]), m[5]) for m in map(ROW.match, proc.stdout.splitlines()) if m}
    return proc, rows


def measured(stdout: str, phase: str) -> str:
    """The `measured ...` line under a phase's row."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if ROW.match(line) and ROW.match(line)[1] == phase)
    return lines[start + 1]


def test_a_7b_shaped_recipe_is_rehearsed_phase_by_phase_within_15_percent_of_the_plan(tmp_path, capsys, monkeypatch):
    proc, rows = rehearse(tmp_path, capsys, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(rows) == ["load", "sync", "generate", "old_log_prob", "ref", "update_actor"]
    for phase in ("generate", "ref", "update_actor"):  # the phases the plan has a line for
        rehearsed, planned, verdict = rows[phase]
        assert abs(rehearsed - planned) <= 0.15 * planned, (phase, rehearsed, planned)
        assert verdict == "fits"
    # What the phases hold, by MemTracker's categories: an update has gradients and AdamW state, a log-prob pass no
    # gradients; the load holds the actor's fp32 shard (1/2 of the model) and the reference's, nothing gathered.
    assert "grad" in measured(proc.stdout, "update_actor") and "opt" in measured(proc.stdout, "update_actor")
    assert "grad" not in measured(proc.stdout, "old_log_prob") and "act" in measured(proc.stdout, "old_log_prob")
    arch = {**hf_config(BUILTIN["qwen2.5-7b"]), "num_hidden_layers": 4}
    params = arch_from_hf_config(arch, "x").params() * 4 / 2 / 2 ** 30  # fp32 / 2 ranks
    load = float(re.search(r"measured ([\d.]+)", measured(proc.stdout, "load"))[1])
    assert 1.9 * params <= load <= 2.1 * params  # actor + fp32 reference shards


def test_a_distillation_teachers_pass_is_rehearsed_beside_its_plan(tmp_path, capsys, monkeypatch):
    """A native teacher (here the same 4-block 7B shape, bf16, offloaded between its passes) is built as its worker
    builds it and runs one micro-batch of its token budget with the top-k it returns."""
    teacher = ["distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'qwen2.5-7b-4layers'}",
               "distillation.teacher_models.teacher_model.inference.name=native", "distillation.distillation_loss.loss_mode=forward_kl_topk",
               "distillation.distillation_loss.use_policy_gradient=False", "distillation.teacher_models.teacher_model.inference.param_offload=True"]
    proc, rows = rehearse(tmp_path, capsys, monkeypatch, *teacher)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(rows) == ["load", "sync", "generate", "old_log_prob", "ref", "teacher_teacher_model", "update_actor"]
    rehearsed, planned, verdict = rows["teacher_teacher_model"]
    assert abs(rehearsed - planned) <= 0.15 * planned and verdict == "fits", (rehearsed, planned)


def test_a_phase_that_does_not_fit_fails_the_rehearsal(tmp_path, capsys, monkeypatch):
    proc, rows = rehearse(tmp_path, capsys, monkeypatch, "trainer.device_memory_gb=30")
    assert proc.returncode == 1
    assert rows["generate"][2] == "OOM" and rows["ref"][2] == "fits"  # vLLM's 18 GiB beside the actor's 11 GiB of state


def test_megatron_is_named_as_not_rehearsed(capsys, monkeypatch):
    proc = plan(capsys, monkeypatch, "--elsewhere", "--config-name", "ppo_megatron_trainer", "--rehearse", "recipe=qwen2_32b_grpo_megatron")
    assert proc.returncode == 1
    assert "not rehearsed: the rehearsal covers strategy=fsdp2 only" in proc.stderr


def test_ulysses_halves_a_ranks_activations_for_the_same_micro_batch(tmp_path, capsys, monkeypatch):
    fixed = ["actor_rollout_ref.actor.use_dynamic_bsz=False", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
             "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
             "actor_rollout_ref.model.enable_gradient_checkpointing=False"]  # activations, not gathered weights, dominate
    work = {}
    for sp in (1, 2):
        proc, rows = rehearse(tmp_path, capsys, monkeypatch, *fixed, f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # the activations at the update's peak (the backward temporaries beside them are the head's and the
        # gradients' reduce buffers, the same for both)
        work[sp] = float(re.search(r"act ([\d.]+)", measured(proc.stdout, "update_actor"))[1])
        assert ("Ulysses sp=2: each rank rehearsed with its slice (1/2)" in proc.stdout) == (sp == 2)
    assert 0.45 <= work[2] / work[1] <= 0.55, work  # 8 full-length rows per rank, then 4 (half of each micro-batch)


def test_a_vision_language_recipe_is_rehearsed_with_images_filling_its_prompts(tmp_path, capsys, monkeypatch):
    """Qwen2.5-VL-7B's shapes with 2 text blocks and 2 tower blocks over a fake world of 2: HF's Qwen-VL code reads
    the token ids and image grids on the host (kept real), the tower runs on fake pixels."""
    config = hf_config(BUILTIN["qwen2.5-vl-7b"])
    config["text_config"]["num_hidden_layers"] = 2
    config["vision_config"] = dict(config["vision_config"], depth=2, fullatt_block_indexes=[1])
    model = tmp_path / "qwen2.5-vl-7b-2layers"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    proc = plan(capsys, monkeypatch, "--elsewhere", "--rehearse", "recipe=qwen2_5_vl_7b_grpo", f"actor_rollout_ref.model.path={model}",
                "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {m[1]: (float(m[2]), None if m[3] == "-" else float(m[3]), m[5]) for m in map(ROW.match, proc.stdout.splitlines()) if m}
    for phase in ("generate", "ref", "update_actor"):
        rehearsed, planned, verdict = rows[phase]
        assert abs(rehearsed - planned) <= 0.15 * planned and verdict == "fits", (phase, rehearsed, planned)
    assert "one image filling it: 31 x 32 merged tokens, 3968 patches" in proc.stdout
