"""What a critic checkpoint holds and what a resume restores (verl 0.9's critic.checkpoint.save_contents /
load_contents, the actor's meaning: tests/workers/test_actor_checkpoint.py)."""

import json
import os

import torch
import torch.distributed.checkpoint as dcp
from dist_utils import free_port, init_gloo
from grpo_step import family_cfg

from rlcore.workers.critic import CriticWorker


def test_critic_checkpoint_contents_decide_what_a_save_holds_and_a_resume_restores(tiny_model_dir, tiny_task_dir, tmp_path):
    """verl 0.9's critic.checkpoint.save_contents / load_contents, with the actor's meaning: a save without
    "optimizer" writes none, "hf_model" adds the value model's HF folder, and load_contents=[model] restores the
    weights and leaves the optimizer as built."""
    init_gloo(0, 1, free_port())
    cfg = family_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "algorithm.adv_estimator=gae", f"critic.model.path={tiny_model_dir}",
                     "critic.checkpoint.save_contents=[model,extra,hf_model]", "critic.checkpoint.load_contents=[model]")
    w = CriticWorker(cfg, 0, 1, "cpu")
    w.init_model(total_steps=4)
    ckpt, hf = str(tmp_path / "critic"), str(tmp_path / "critic" / "huggingface")
    w.save_checkpoint(ckpt, hf)
    saved = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata
    assert any(k.startswith("model.") for k in saved) and not any(k.startswith("optim") for k in saved)
    assert json.load(open(os.path.join(ckpt, "contents.json"))) == ["extra", "hf_model", "model"]
    assert any(f.endswith(".safetensors") for f in os.listdir(hf))
    before = {n: p.detach().clone() for n, p in w.engine.model.named_parameters()}
    with torch.no_grad():
        for p in w.engine.model.parameters():
            p.add_(1.0)
    w.load_checkpoint(ckpt)
    for n, p in w.engine.model.named_parameters():
        torch.testing.assert_close(p.detach(), before[n], atol=0, rtol=0)
