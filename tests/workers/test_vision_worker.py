"""A GRPO step of the hybrid worker on a vision-language model: greedy rollouts from images whose log-probs equal
the training forward's (fp32, 1e-5), the update, a second sync the rollout follows. On the native engine (the tower
trained, so synced every step) and on vLLM (`make test-vllm`; the tower frozen: the first sync carries it, later ones
leave it out; and the HF export with the processor beside it). A whole run: tests/e2e/test_tiny_vllm.py.)"""


import numpy as np
import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo
from grpo_step import N, family_cfg, grpo_batch
from PIL import Image

from rlcore.data.multimodal import process_row
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.vision import MULTI_MODAL_INPUTS, build_vl_model_dir, load_processor
from rlcore.protocol import DataProto, position_ids_from_mask
from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

PROMPTS = [("what?", []), ("<image>count", [(56, 28)]), ("<image><image>same?", [(28, 28), (56, 56)])]


def prompts_with_images(processor) -> DataProto:
    """Left-padded prompts as the dataset makes them (images expanded into their tokens), each repeated N times,
    with the rows' processor tensors and images."""
    rows = []
    for text, sizes in PROMPTS:
        images = [Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)) for i, (w, h) in enumerate(sizes)]
        rows.append(process_row(processor, [{"role": "user", "content": text}], images))
    width = max(len(ids) for ids, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row_ids, _, _) in enumerate(rows):
        ids[i, width - len(row_ids):], mask[i, width - len(row_ids):] = torch.tensor(row_ids), 1
    inputs, data = np.empty(len(rows), dtype=object), np.empty(len(rows), dtype=object)
    for i, (_, row_inputs, pil) in enumerate(rows):
        inputs[i], data[i] = row_inputs, {"image": pil}
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)},
                                {MULTI_MODAL_INPUTS: inputs, "multi_modal_data": data})
    return batch.repeat(N, interleave=True)


def greedy_matches_training(worker, prompts: DataProto) -> DataProto:
    out = worker.generate_sequences(DataProto(prompts.batch, dict(prompts.non_tensor_batch), {"validate": True, "greedy": True}))
    out.non_tensor_batch[MULTI_MODAL_INPUTS] = prompts.non_tensor_batch[MULTI_MODAL_INPUTS]  # the trainer's union
    train = worker.compute_log_prob(out).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    print(f"{worker.rollout.__class__.__name__}: greedy log-probs {float((train[mask] - out.batch['rollout_log_probs'][mask]).abs().max()):.1e} "
          "off the training forward's")
    torch.testing.assert_close(train[mask], out.batch["rollout_log_probs"][mask], atol=1e-5, rtol=1e-5)
    return out


def grpo_step(worker, prompts: DataProto) -> tuple[DataProto, DataProto]:
    """Greedy rollouts checked against the training forward before and after one GRPO update on sampled ones."""
    before = greedy_matches_training(worker, prompts)
    sampled = worker.generate_sequences(DataProto(prompts.batch, dict(prompts.non_tensor_batch)))
    sampled.non_tensor_batch[MULTI_MODAL_INPUTS] = prompts.non_tensor_batch[MULTI_MODAL_INPUTS]
    metrics = worker.update_actor(grpo_batch(sampled, worker))
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    after = greedy_matches_training(worker, prompts)
    assert (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() > 1e-3  # the sync followed
    return before, after


LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.model.exclude_modules=.*visual.*")


# Qwen3-VL's rollout is checked by tests/rollout/test_native_vision.py; one family goes through the worker.
FROZEN = ("actor_rollout_ref.actor.freeze_vision_tower=True",)


@pytest.mark.parametrize("shape, extra", [("tiny-qwen2-5-vl", ()), ("tiny-qwen2-5-vl", LORA), ("tiny-qwen2-5-vl", FROZEN)],
                         ids=["qwen2.5-vl", "qwen2.5-vl-lora", "qwen2.5-vl-frozen-tower"])
def test_a_grpo_step_of_a_vision_language_model_on_fsdp2_and_the_native_engine(shape, extra, tiny_task_dir, tmp_path):
    model_dir = build_vl_model_dir(str(tmp_path / "vl"), shape, build_char_tokenizer())
    prompts = prompts_with_images(load_processor(model_dir))
    init_gloo(0, 1, free_port())
    try:
        cfg = family_cfg(model_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.rollout.name=native",
                         "actor_rollout_ref.rollout.prompt_length=64", "data.max_prompt_length=64", *extra)
        worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
        worker.init_model(total_steps=2)
        before, after = grpo_step(worker, prompts)  # a trained tower: every sync carries it, the rollout's follows
        if extra == FROZEN:  # the native engine keeps the tower it was sent first (asleep at level 1): later syncs leave it out
            tower = sum(p.numel() * p.element_size() for n, p in worker.actor.model.named_parameters() if n.startswith("model.visual"))
            synced = [round(out.meta_info["timing"]["rollout/weights_synced_gib"] * 2**30) for out in (before, after)]
            assert synced[0] - synced[1] == tower > 0
        assert worker.rollout.stats["prefill_tokens"] == sum(int(m.sum()) for m in prompts.batch["attention_mask"][::N])
    finally:
        close_gloo()


@pytest.mark.vllm
def test_a_grpo_step_of_a_vision_language_model_on_fsdp2_and_vllm(tiny_task_dir, tmp_path):
    model_dir = build_vl_model_dir(str(tmp_path / "vl"), "tiny-qwen2-5-vl", build_char_tokenizer(),
                                   text=dict(hidden_size=128, head_dim=32), vision=dict(hidden_size=64, out_hidden_size=128))
    prompts = prompts_with_images(load_processor(model_dir))
    init_gloo(0, 1, free_port())
    cfg = family_cfg(model_dir, tiny_task_dir, tmp_path, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.prompt_length=64",
                     "data.max_prompt_length=64", "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
                     "actor_rollout_ref.actor.freeze_vision_tower=True")
    worker = ActorRolloutRefWorker(cfg, 0, 1, "cpu")
    worker.init_model(total_steps=2)
    before, after = grpo_step(worker, prompts)  # the language model's update reaches vLLM, which kept the tower it was sent
    tower_bytes = sum(p.numel() * p.element_size() for n, p in worker.actor.model.named_parameters() if n.startswith("model.visual"))
    synced = [round(out.meta_info["timing"]["rollout/weights_synced_gib"] * 2**30) for out in (before, after)]
    print(f"bytes per sync: first {synced[0]:.0f}, later {synced[1]:.0f} (the tower: {tower_bytes})")
    assert synced[0] - synced[1] == tower_bytes

    worker.save_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    exported = load_processor(str(tmp_path / "hf"))  # the processor beside the weights
    assert exported.image_processor.patch_size == 14
    worker.rollout.llm.llm_engine.engine_core.shutdown()  # vLLM's shutdown destroys the process groups, the test's too
