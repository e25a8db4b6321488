"""The vision tower's attention (rlcore.models.tower_attention): one call per block over all of a micro-batch's
windows and images, equal to HF's own tower, which calls attention once per window."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForImageTextToText

from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.families.vision import TINY_VISION
from rlcore.models import tower_attention as ta
from rlcore.models.vision import build_vl_model_dir, vision_tower

pytestmark = pytest.mark.numerics


def test_segments_attend_within_themselves_in_both_directions():
    g = torch.Generator().manual_seed(0)
    lengths = [3, 5, 2, 5, 1]
    q, k, v = (torch.randn(2, sum(lengths), 8, generator=g) for _ in range(3))
    cu = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
    expected = torch.cat([F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b]).transpose(0, 1)
                          for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    torch.testing.assert_close(ta.segment_full_attention(q, k, v, cu), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("shape", sorted(TINY_VISION))
def test_the_tower_equals_hfs_with_one_attention_call_per_block(shape, tmp_path, monkeypatch):
    model_dir = build_vl_model_dir(str(tmp_path / shape), shape, build_char_tokenizer())
    hf = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    v = hf.config.vision_config
    # two images of 8 x 6 and 4 x 4 patches: Qwen2.5-VL's windows of 2 x 2 merged tokens come out uneven (4, 2 and 4 patches)
    grid = torch.tensor([[1, 8, 6], [1, 4, 4]])
    pixels = torch.randn(int(grid.prod(-1).sum()), v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
                         generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = vision_tower(hf)(pixels, grid_thw=grid, return_dict=True).pooler_output
        counted = []
        real = ta.segment_full_attention
        monkeypatch.setattr(ta, "segment_full_attention", lambda *a, **k: counted.append(a[3].tolist()) or real(*a, **k))
        ta.use_tower_attention(hf)
        got = vision_tower(hf)(pixels, grid_thw=grid, return_dict=True).pooler_output
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(counted) == v.depth, counted  # one call per block, whatever the number of windows
    if shape == "tiny-qwen2-5-vl":
        assert any(len(cu) > 3 for cu in counted), counted  # a window block saw more segments than images
