"""What an actor checkpoint holds and what a resume restores (actor_rollout_ref.actor.checkpoint.save_contents /
load_contents, verl's meaning): "model", "optimizer", "extra" (lr schedule + RNG), "hf_model" (an HF folder)."""

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dist_utils import free_port, init_gloo
from grpo_step import family_cfg, grpo_batch, prompts_batch
from transformers import AutoModelForCausalLM

from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

KEY = "actor_rollout_ref.actor.checkpoint"


def worker(model_dir, task_dir, out_dir, *overrides):
    w = ActorRolloutRefWorker(family_cfg(model_dir, task_dir, out_dir, *overrides), 0, 1, "cpu")
    w.init_model(total_steps=4)
    return w


def trained(model_dir, task_dir, out_dir, *overrides):
    """A worker after one GRPO update: weights moved, AdamW moments exist, the schedule advanced."""
    init_gloo(0, 1, free_port())
    w = worker(model_dir, task_dir, out_dir, *overrides)
    w.update_actor(grpo_batch(w.generate_sequences(prompts_batch(w.actor.hf_config.vocab_size)), w))
    return w


def weights(w):
    return {name: t.clone() for name, t in w.actor.rollout_weights()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def moments(w):
    return [s["exp_avg"] for s in w.actor.optimizer.state.values()]


def warnings_in(text):
    return [line for line in text.splitlines() if line.startswith("WARNING:")]


def test_save_without_optimizer_writes_none_and_the_resume_starts_a_fresh_optimizer(tiny_model_dir, tiny_task_dir, tmp_path, capfd):
    contents = f"{KEY}.save_contents=[model,extra]"
    w = trained(tiny_model_dir, tiny_task_dir, tmp_path, contents)
    ckpt, hf = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    w.save_checkpoint(ckpt, hf)
    saved = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata
    assert any(k.startswith("model.") for k in saved) and not any(k.startswith("optim") for k in saved)
    assert json.load(open(os.path.join(ckpt, "contents.json"))) == ["extra", "model"]
    # no "hf_model": the HF folder holds the config and tokenizer only (as verl's), no weights
    assert {"config.json", "tokenizer_config.json"} <= set(os.listdir(hf)) and not any(f.endswith(".safetensors") for f in os.listdir(hf))

    capfd.readouterr()
    resumed = worker(tiny_model_dir, tiny_task_dir, tmp_path / "resumed", contents)  # load_contents follows save_contents
    resumed.load_checkpoint(ckpt)
    assert warnings_in(capfd.readouterr().out) == [
        f"WARNING: {KEY}.load_contents has no 'optimizer': the actor starts a fresh optimizer (no AdamW moments) ({ckpt})"]
    assert_same(weights(resumed), weights(w))
    assert resumed.actor.optimizer.state == {} and moments(w)  # fresh: AdamW builds its moments at the first step
    assert resumed.actor.optimizer_steps == w.actor.optimizer_steps == 1  # "extra": the schedule's position


def test_load_contents_model_only_ignores_the_saved_optimizer_and_schedule(tiny_model_dir, tiny_task_dir, tmp_path, capfd):
    w = trained(tiny_model_dir, tiny_task_dir, tmp_path)
    ckpt = str(tmp_path / "ckpt")
    w.save_checkpoint(ckpt, str(tmp_path / "hf"))
    full = worker(tiny_model_dir, tiny_task_dir, tmp_path / "full")  # the default restores everything
    full.load_checkpoint(ckpt)
    for a, b in zip(moments(full), moments(w), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert full.actor.optimizer_steps == 1

    capfd.readouterr()
    only = worker(tiny_model_dir, tiny_task_dir, tmp_path / "only", f"{KEY}.load_contents=[model]")
    only.load_checkpoint(ckpt)
    notes = warnings_in(capfd.readouterr().out)
    assert len(notes) == 2 and "has no 'optimizer'" in notes[0] and "restarts its lr schedule at step 0" in notes[1]
    assert_same(weights(only), weights(w))
    assert only.actor.optimizer.state == {} and only.actor.optimizer_steps == 0


def test_hf_model_writes_an_hf_folder_with_the_trained_weights(tiny_model_dir, tiny_task_dir, tmp_path):
    w = trained(tiny_model_dir, tiny_task_dir, tmp_path, f"{KEY}.save_contents=[model,optimizer,extra,hf_model]")
    w.save_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    ours = weights(w)
    assert ours["model.embed_tokens.weight"].abs().sum() > 0
    for name, tensor in hf.state_dict().items():  # a tied head is stored once, as the embedding
        torch.testing.assert_close(tensor, ours[name if name in ours else "model.embed_tokens.weight"], atol=0, rtol=0)
    # the default load_contents follows save_contents; "hf_model" is export only and a resume ignores it
    resumed = worker(tiny_model_dir, tiny_task_dir, tmp_path / "resumed", f"{KEY}.save_contents=[model,optimizer,extra,hf_model]")
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert_same(weights(resumed), ours)


def test_a_checkpoint_without_model_resumes_from_the_initial_weights_or_is_refused(tiny_model_dir, tiny_task_dir, tmp_path, capfd):
    contents = f"{KEY}.save_contents=[optimizer,extra]"
    w = trained(tiny_model_dir, tiny_task_dir, tmp_path, contents)
    ckpt = str(tmp_path / "ckpt")
    w.save_checkpoint(ckpt, str(tmp_path / "hf"))
    capfd.readouterr()
    resumed = worker(tiny_model_dir, tiny_task_dir, tmp_path / "resumed", contents)
    initial = weights(resumed)
    resumed.load_checkpoint(ckpt)  # as verl: load_contents follows save_contents, so the weights stay model.path's
    assert warnings_in(capfd.readouterr().out) == [
        f"WARNING: {KEY}.load_contents has no 'model': the actor keeps the initial weights (model.path), not the "
        f"checkpoint's (it holds none) ({ckpt})"]
    assert_same(weights(resumed), initial)
    assert any(not torch.equal(initial[k], v) for k, v in weights(w).items())  # the update had moved them
    assert moments(resumed) and resumed.actor.optimizer_steps == 1
    asks = worker(tiny_model_dir, tiny_task_dir, tmp_path / "asks", contents, f"{KEY}.load_contents=[model,optimizer]")
    with pytest.raises(ValueError, match=r"asks for \['model'\].*holds only \['extra', 'optimizer'\].*drop \['model'\]"):
        asks.load_checkpoint(ckpt)
