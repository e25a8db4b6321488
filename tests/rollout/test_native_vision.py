"""The native engine on vision-language models (rlcore.rollout.native_vision): each prompt's images through the
tower once at its prefill, the group's samples sharing it, the multimodal RoPE continued through decode. Against
HF's own generate and forward of each row alone (the placeholders out of the distribution on both sides), tiny
random Qwen2.5-VL and Qwen3-VL, rows of zero, one and two images, after a weight sync."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from rlcore.data.multimodal import process_row
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.families.vision import placeholder_token_ids
from rlcore.models.logits import gather_log_probs
from rlcore.models.vision import build_vl_model_dir, load_processor
from rlcore.rollout.base import SamplingParams
from rlcore.rollout.native import NativeRollout

PROMPTS = [("what?", []), ("<image>count", [(56, 28)]), ("<image><image>same?", [(28, 28), (56, 56)])]
N, TOKENS = 2, 6


@pytest.fixture(scope="module", params=["tiny-qwen2-5-vl", "tiny-qwen3-vl"])
def vl(request, tmp_path_factory):
    """(model dir, the rows (ids, processor tensors), HF's model with changed weights to sync)."""
    model_dir = build_vl_model_dir(str(tmp_path_factory.mktemp("vl") / request.param), request.param, build_char_tokenizer())
    processor = load_processor(model_dir)
    rows = []
    for text, sizes in PROMPTS:
        images = [Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype(np.uint8)) for i, (w, h) in enumerate(sizes)]
        ids, inputs, _ = process_row(processor, [{"role": "user", "content": text}], images)
        rows.append((ids, inputs or None))
    hf = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # the sync must carry these, not the checkpoint's
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model_dir, rows, hf


def batch_of(rows):
    """Left-padded prompts, each repeated N times (a group), and each row's processor tensors."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows) * N, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row_ids, _) in enumerate(rows):
        ids[i * N: (i + 1) * N, width - len(row_ids):], mask[i * N: (i + 1) * N, width - len(row_ids):] = torch.tensor(row_ids), 1
    return ids, mask, [inputs for _, inputs in rows for _ in range(N)]


@pytest.mark.parametrize("max_num_seqs", [6, 2], ids=["one-prefill", "a-group-at-a-time"])
def test_native_rollout_of_a_vision_language_model_equals_hfs_generate_and_forward(vl, max_num_seqs):
    model_dir, rows, hf = vl
    engine = NativeRollout(model_dir, 0, torch.device("cpu"), max_num_seqs=max_num_seqs)
    engine.update_weights(hf.state_dict().items())
    ids, mask, inputs = batch_of(rows)
    placeholders, image_token = list(placeholder_token_ids(hf.config)), hf.config.image_token_id
    for greedy in (True, False):
        out = engine.generate(ids, mask, SamplingParams(max_tokens=TOKENS, do_sample=not greedy, seed=3), multi_modal_inputs=inputs)
        assert engine.stats["prefill_tokens"] == sum(len(row_ids) for row_ids, _ in rows)  # once per group, images included
        worst = 0.0
        for r in range(len(ids)):
            row_ids, row_inputs = rows[r // N]
            prompt, response = torch.tensor([row_ids]), out.responses[r][out.response_mask[r].bool()]
            with torch.no_grad():
                if greedy:
                    expected = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), mm_token_type_ids=(prompt == image_token).int(),
                                           max_new_tokens=TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None,
                                           suppress_tokens=placeholders, **(row_inputs or {}))[0, prompt.shape[1]:]
                    assert torch.equal(response, expected), (r, response, expected)
                full = torch.cat([prompt[0], response])[None]
                logits = hf(input_ids=full, mm_token_type_ids=(full == image_token).int(), use_cache=False, **(row_inputs or {})).logits[0]
            logits[:, placeholders] = float("-inf")
            want = gather_log_probs(logits[prompt.shape[1] - 1: -1], response)
            worst = max(worst, float((out.response_log_probs[r][: len(response)] - want).abs().max()))
        print(f"{'greedy' if greedy else 'sampled'}, max_num_seqs={max_num_seqs}: log-probs {worst:.1e} off HF's forward")
        assert worst < 1e-5


def test_images_with_multi_turn_calls_are_refused(vl):
    model_dir, rows, _ = vl
    engine = NativeRollout(model_dir, 0, torch.device("cpu"))
    ids, mask, inputs = batch_of(rows)
    with pytest.raises(ValueError, match="multi-turn calls .* with images are not supported"):
        engine.generate(ids, mask, SamplingParams(max_tokens=2), keep_kv=True, multi_modal_inputs=inputs)
